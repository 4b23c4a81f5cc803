"""Reading a config file: YAML or JSON in, plain data plus a key -> line map out."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KeyPath = tuple[str, ...]


class Unreadable(Exception):
    """The file cannot be read or parsed; `line` is 1-based where known."""

    def __init__(self, message: str, line: int | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.hint = hint


@dataclass
class Source:
    data: object
    lines: dict[KeyPath, int] = field(default_factory=dict)
    duplicates: list[tuple[KeyPath, int, int]] = field(default_factory=list)

    def line_of(self, path: KeyPath) -> int | None:
        """The line of `path`'s key, else of its nearest ancestor that has one."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def read_source(file: str | Path) -> Source:
    path = Path(file)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Unreadable(f"no such file: `{path}`") from None
    except IsADirectoryError:
        raise Unreadable(f"`{path}` is a directory, not a config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise Unreadable(f"cannot read `{path}`: {e}") from None
    if path.suffix.lower() == ".json":
        return parse_json(text)
    return parse_yaml(text)


def parse_json(text: str) -> Source:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise Unreadable(f"invalid JSON: {e.msg} (column {e.colno})", line=e.lineno) from None
    return Source(data=data)


#: libyaml's parser where the wheel has it: the pure-Python one is ~10x slower on large fleets.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Source:
    """Parse once into nodes (which carry line marks), then construct plain data from them."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Source(data=None)
        source = Source(data=None)
        _walk(node, (), source)
        source.data = loader.construct_document(node)
        return source
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "syntax error"
        raise Unreadable(f"invalid YAML: {problem}", line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise Unreadable(f"invalid YAML: {e}") from None
    finally:
        loader.dispose()


def _walk(node: yaml.Node, path: KeyPath, source: Source) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = path + (key,)
            line = key_node.start_mark.line + 1
            if child in source.lines:
                source.duplicates.append((child, source.lines[child], line))
            source.lines[child] = line
            _walk(value_node, child, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            child = path + (str(i),)
            source.lines.setdefault(child, item.start_mark.line + 1)
            _walk(item, child, source)
