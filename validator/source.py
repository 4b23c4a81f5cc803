"""Reading a config file: YAML or JSON in, plain data plus a key -> line map out."""

from __future__ import annotations

import json
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mtpstack.errors import UserError
from mtpstack.validator.bounds import depth_exceeds

KeyPath = tuple[str, ...]


class Unreadable(UserError):
    """The file cannot be read or parsed; `line` is 1-based where known."""

    def __init__(self, message: str, line: int | None = None, hint: str | None = None):
        super().__init__(message, hint)
        self.line = line


@dataclass
class Source:
    data: object
    lines: dict[KeyPath, int] = field(default_factory=dict)
    #: (path, first line, repeated line); the lines are None for JSON, which has no line map.
    duplicates: list[tuple[KeyPath, int | None, int | None]] = field(default_factory=list)

    def line_of(self, path: KeyPath) -> int | None:
        """The line of `path`'s key, else of its nearest ancestor that has one."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


#: Deepest nesting of mappings and lists. A fleet nests 4 levels (`workers.NAME.drafter.bits`);
#: the parsers recurse per level, so a deeper file is refused before anything recurses into it.
MAX_DEPTH = 32
#: Nodes YAML aliases may add by expansion. Sharing a drafter block among a few hundred workers
#: stays far below it; nine levels of nine aliases (a 400-byte file) would be 387 million.
MAX_ALIAS_NODES = 10_000
#: Longest integer literal, in characters: 2^64 has 20 digits, and Python refuses to convert
#: more than 4,300 (a ValueError, not a parse error).
MAX_INT_CHARS = 32


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def read_source(file: str | Path) -> Source:
    path = Path(file)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise Unreadable(f"no such file: `{path}`") from None
    except OSError as e:
        raise Unreadable(f"cannot read `{path}`: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise Unreadable(f"`{path}` is a directory, not a config file")
    if not stat.S_ISREG(mode):
        # Opening a FIFO blocks until a writer comes, which may be never.
        raise Unreadable(f"`{path}` is not a regular file (a pipe, socket or device)", hint="write the config to a file first")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise Unreadable(f"cannot read `{path}`: {e}") from None
    if path.suffix.lower() == ".json":
        return parse_json(text)
    return parse_yaml(text)


class _LongInt(Exception):
    def __init__(self, literal: str):
        self.literal = literal


def _json_int(literal: str) -> int:
    if len(literal) > MAX_INT_CHARS:
        raise _LongInt(literal)
    return int(literal)


def _long_int(literal: str, line: int | None) -> Unreadable:
    return Unreadable(
        f"an integer of {len(literal.lstrip('+-'))} digits is longer than any setting needs: the limit is {MAX_INT_CHARS} characters",
        line=line,
    )


def _too_deep(line: int | None) -> Unreadable:
    return Unreadable(f"mappings and lists nest deeper than {MAX_DEPTH} levels", line=line)


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _json_depth_line(text: str) -> int | None:
    """The line where a JSON text first nests deeper than `MAX_DEPTH` (strings skipped)."""
    depth = 0
    for m in _JSON_TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return _line_at(text, m.start())
        elif c in "]}":
            depth -= 1
    return None


def parse_json(text: str) -> Source:
    """JSON has no line map here (findings carry `line: null`), except where the text is unreadable."""
    repeated: list[tuple[dict, str]] = []

    def pairs(items: list[tuple[str, object]]) -> dict:
        obj = dict(items)
        if len(obj) < len(items):
            seen: set[str] = set()
            repeated.extend((obj, k) for k, _ in items if k in seen or seen.add(k))
        return obj

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_int=_json_int)
    except json.JSONDecodeError as e:
        raise Unreadable(f"invalid JSON: {e.msg} (column {e.colno})", line=e.lineno) from None
    except RecursionError:
        raise _too_deep(_json_depth_line(text)) from None
    except _LongInt as e:
        raise _long_int(e.literal, _line_at(text, text.find(e.literal))) from None
    if depth_exceeds(data, MAX_DEPTH):
        raise _too_deep(_json_depth_line(text))
    source = Source(data=data)
    if repeated:
        paths = _paths_of({id(obj) for obj, _ in repeated}, data)
        source.duplicates = [(paths[id(obj)] + (key,), None, None) for obj, key in repeated]
    return source


def _paths_of(wanted: set[int], data: object) -> dict[int, KeyPath]:
    """Key paths of the dicts in `data` whose ids are `wanted`."""
    found: dict[int, KeyPath] = {}
    stack: list[tuple[object, KeyPath]] = [(data, ())]
    while stack:
        item, path = stack.pop()
        if id(item) in wanted:
            found[id(item)] = path
        if isinstance(item, dict):
            stack.extend((v, path + (str(k),)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, path + (str(i),)) for i, v in enumerate(item))
    return found


#: libyaml's parser where the wheel has it: the pure-Python one is ~10x slower on large fleets.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT_TAG = "tag:yaml.org,2002:int"


def parse_yaml(text: str) -> Source:
    """Parse once into nodes (which carry line marks), check their shape, then construct plain data."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Source(data=None)
        source = Source(data=None)
        _walk(node, source)
        try:
            source.data = loader.construct_document(node)
        except (ValueError, TypeError, OverflowError) as e:  # an implicit timestamp such as 2024-13-45
            raise Unreadable(f"invalid YAML value: {e}") from None
        return source
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "syntax error"
        raise Unreadable(f"invalid YAML: {problem}", line=mark.line + 1 if mark else None) from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, most controls)
        character = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise Unreadable(f"invalid YAML: character {character} is not allowed ({e.reason})",
                         line=_line_at(text, e.position) if isinstance(e.position, int) else None) from None
    except yaml.YAMLError as e:
        raise Unreadable(f"invalid YAML: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    finally:
        loader.dispose()


def _walk(root: yaml.Node, source: Source) -> None:
    """Record each key's line, refusing what would make construction (or anything after it)
    recurse or expand without bound: nesting past `MAX_DEPTH`, an alias inside its own anchor,
    aliases that expand past `MAX_ALIAS_NODES`, integers past `MAX_INT_CHARS`. Iterative."""
    seen: set[int] = set()
    visits = 0
    # (node, its key path, its depth, the chain of its ancestors as nested pairs)
    stack: list[tuple[yaml.Node, KeyPath, int, tuple | None]] = [(root, (), 1, None)]
    while stack:
        node, path, depth, chain = stack.pop()
        visits += 1
        seen.add(id(node))
        if visits - len(seen) > MAX_ALIAS_NODES:
            raise Unreadable(
                f"YAML aliases expand to more than {MAX_ALIAS_NODES:,} nodes",
                # Nodes reached through an alias carry their anchor's marks; the top-level key
                # whose value is expanding is the place to look.
                line=source.line_of(path[:1]) or node.start_mark.line + 1,
                hint="write the repeated blocks out, or use fewer aliases of large anchors",
            )
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _INT_TAG and len(node.value) > MAX_INT_CHARS:
                raise _long_int(node.value, node.start_mark.line + 1)
            continue
        if depth > MAX_DEPTH:
            link = chain
            while link is not None:
                if link[0] is node:
                    raise Unreadable("a YAML alias refers to its own anchor, so the value would never end",
                                     line=source.line_of(path) or node.start_mark.line + 1)
                link = link[1]
            raise _too_deep(node.start_mark.line + 1)
        here = (node, chain)
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in reversed(node.value):
                if not isinstance(key_node, yaml.ScalarNode):
                    raise Unreadable("a mapping key must be a plain value, not a mapping or a list",
                                     line=key_node.start_mark.line + 1)
                stack.append((value_node, path + (str(key_node.value),), depth + 1, here))
            # Lines in document order, so a repeated key is reported at its second place.
            for key_node, _ in node.value:
                child = path + (str(key_node.value),)
                line = key_node.start_mark.line + 1
                if child in source.lines:
                    source.duplicates.append((child, source.lines[child], line))
                source.lines[child] = line
        elif isinstance(node, yaml.SequenceNode):
            for i in range(len(node.value) - 1, -1, -1):
                item = node.value[i]
                child = path + (str(i),)
                source.lines.setdefault(child, item.start_mark.line + 1)
                stack.append((item, child, depth + 1, here))
