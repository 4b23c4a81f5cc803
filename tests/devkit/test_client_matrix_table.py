"""`devkit.client_matrix.table`: the docs table, one row per cell whatever a client's error says."""

from devkit.client_matrix import ROOT, SERVERS, table


def test_a_failure_detail_spanning_lines_stays_in_its_row_without_the_checkouts_path():
    detail = f"InstructorRetryException: <failed_attempts>\n\n<generation number=\"1\">\n| a | {ROOT}/devkit/clients.py"
    cell = {"client": "instructor", "feature": "forced tool call (TOOLS)"}
    reports = {SERVERS[0]: {"versions": {"instructor": "1.17.0"}, "cells": [{**cell, "ok": True, "detail": "ok"}]},
               SERVERS[1]: {"versions": {}, "cells": [{**cell, "ok": False, "detail": detail}]}}
    lines = table(reports).splitlines()
    [row] = [line for line in lines if line.startswith("| instructor")]
    assert lines[3] == "" and lines[4].startswith("Passed: ")  # header, separator, the row, then the summary
    assert row.startswith("| instructor | forced tool call (TOOLS) | yes | no: InstructorRetryException: <failed_attempts> <generation")
    assert row.count("|") == 5 and str(ROOT) not in row


def test_the_peer_column_appears_only_when_the_peer_ran():
    from devkit.client_matrix import LITELLM

    cell = {"client": "anthropic", "feature": "messages", "ok": True, "detail": "end_turn"}
    reports = {s: {"versions": {"anthropic": "2.16.0"}, "cells": [cell]} for s in SERVERS}
    assert LITELLM not in table(reports).splitlines()[0]
    reports[LITELLM] = {"versions": {}, "cells": [{**cell, "ok": False, "detail": "NotFoundError"}]}
    lines = table(reports).splitlines()
    assert lines[0].endswith(f"| {LITELLM} |") and lines[2] == "| anthropic | messages | yes | yes | no: NotFoundError |"
    assert f"{LITELLM} 0/1" in lines[-1]
