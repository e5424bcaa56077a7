"""The allreduce route table of docs/ARCHITECTURE.md says what the code does.

No processes, no build: reads the table and the sources. Every default the table gives
(`RINGDIST_X` / `kName` = value, or `kName` (`header`) = value) equals the constant in
csrc/common/options.h (or the header named), every setting is read in csrc/backend/environment.cc
with that constant (or that default) as its fallback, every function the code column names is in
the file it names, and the table names every default of CollectiveOptions that routes use.
"""
import os
import re

import pytest

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHITECTURE = "docs/ARCHITECTURE.md"
OPTIONS_H = "csrc/common/options.h"
ENVIRONMENT_CC = "csrc/backend/environment.cc"
HEADING = "## Allreduce routes"
COLUMNS = ["route", "group and tensor", "taken when", "thresholds: setting / constant = default",
           "code"]
# CollectiveOptions defaults that no allreduce route reads, and why.
NOT_A_ROUTE = {"kDefaultMaxUnexpectedBytes": "point-to-point messages only"}

UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
# `RINGDIST_X` / `kName` = 64 KiB, `kName` (`csrc/x.h`) = 4 KiB, `kName` = 1.2
DEFAULT = re.compile(r"(?:`(RINGDIST_\w+)` / )?`(k\w+)`(?: \(`([\w/.]+)`\))? = "
                     r"([0-9]+(?:\.[0-9]+)?)(?: ([KMG]iB))?")
# `RINGDIST_X` = 1, = auto: a flag or a name, its default in environment.cc
SETTING_DEFAULT = re.compile(r"`(RINGDIST_\w+)` = (\w+)")
SETTING = re.compile(r"`(RINGDIST_\w+)`")
# `name`, `Class::name` in `csrc/path`
CODE = re.compile(r"((?:`[\w:]+`(?:, )?)+) in `(csrc/[\w/.]+)`")
CONSTANT = re.compile(r"^\s*(?:static\s+)?(?:inline\s+)?constexpr\s+[\w:<>\s]+?\b(k\w+)\s*=\s*([^;]+);",
                      re.M)


def read(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def route_rows():
    """The table under HEADING, as dicts by column."""
    text = read(ARCHITECTURE)
    assert HEADING in text, f"{ARCHITECTURE} has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == COLUMNS, f"the route table's columns changed: {header}"
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == len(COLUMNS), f"a row of {len(cells)} cells: {line}"
        rows.append(dict(zip(COLUMNS, cells)))
    return rows


def cpp_value(expression):
    """The value of a constant's initializer: integers, <<, *, +, a size_t{...} or a double."""
    e = re.sub(r"\b(?:size_t|uint64_t|int64_t)\{([^}]*)\}", r"(\1)", expression.strip())
    e = re.sub(r"(?<=\d)(?:ull|ul|ll|u|l)\b", "", e, flags=re.I)
    assert re.fullmatch(r"[0-9.\s()<>*+\-/]+", e), f"cannot evaluate '{expression}'"
    return eval(e, {"__builtins__": {}})  # only digits and operators reach here


def constants(path):
    return {name: value for name, value in CONSTANT.findall(read(path))}


def table_value(number, unit):
    value = float(number) * UNITS[unit or ""]
    return int(value) if value.is_integer() else value


def fallback_in_environment(setting):
    """The fallback environment.cc reads `setting` with (the text after the name)."""
    m = re.search(r'"' + setting + r'",\s*([^,)]+)', read(ENVIRONMENT_CC))
    return m.group(1).strip() if m else None


def test_table_is_there():
    routes = [row["route"] for row in route_rows()]
    assert len(routes) == len(set(routes)), "a route twice"
    for name in ("board", "one round", "single copy", "two-level", "compressed", "staged",
                 "pipelined staging", "same-GPU fused"):
        assert any(route.startswith(name) for route in routes), f"no '{name}' route"


def test_defaults_equal_the_constants():
    checked = 0
    bad = []
    for row in route_rows():
        cell = row[COLUMNS[3]]
        for setting, name, header, number, unit in DEFAULT.findall(cell):
            header = header or OPTIONS_H
            defined = constants(header)
            if name not in defined:
                bad.append(f"{row['route']}: {name} is not a constant of {header}")
                continue
            code, table = cpp_value(defined[name]), table_value(number, unit)
            if code != table:
                bad.append(f"{row['route']}: {name} = {code} in {header}, the table says {table}")
            if setting and fallback_in_environment(setting) != name:
                bad.append(f"{row['route']}: {ENVIRONMENT_CC} does not read {setting} with "
                           f"{name} as its default (reads {fallback_in_environment(setting)})")
            checked += 1
    assert not bad, "\n".join(bad)
    assert checked >= 10, f"only {checked} defaults parsed: the table's format changed"


def test_settings_read_in_environment_cc():
    bad = []
    for row in route_rows():
        cell = row[COLUMNS[3]]
        for setting in SETTING.findall(" ".join(row.values())):
            if fallback_in_environment(setting) is None:
                bad.append(f"{row['route']}: {setting} is not read in {ENVIRONMENT_CC}")
        for setting, default in SETTING_DEFAULT.findall(cell):
            fallback = fallback_in_environment(setting)
            expected = {"0": "false", "1": "true"}.get(default, f'"{default}"')
            if fallback != expected:
                bad.append(f"{row['route']}: {setting} = {default} in the table, "
                           f"{ENVIRONMENT_CC} falls back to {fallback}")
    assert not bad, "\n".join(bad)


def test_code_named_is_there():
    bad = []
    for row in route_rows():
        pairs = CODE.findall(row["code"])
        if not pairs:
            bad.append(f"{row['route']}: no `name` in `csrc/...` in the code column")
        for names, path in pairs:
            if not os.path.isfile(os.path.join(REPO, path)):
                bad.append(f"{row['route']}: {path} does not exist")
                continue
            text = read(path)
            for name in re.findall(r"`([\w:]+)`", names):
                if not re.search(r"\b" + name.split("::")[-1] + r"\b", text):
                    bad.append(f"{row['route']}: {name} is not in {path}")
    assert not bad, "\n".join(bad)


def test_every_route_default_is_in_the_table():
    struct = read(OPTIONS_H).split("struct CollectiveOptions {", 1)[1].split("\n};", 1)[0]
    used = set(re.findall(r"=\s*(kDefault\w+)", struct)) - set(NOT_A_ROUTE)
    named = {name for row in route_rows() for _, name, _, _, _ in DEFAULT.findall(row[COLUMNS[3]])}
    assert used, "no defaults found in CollectiveOptions: the pattern is stale"
    assert not used - named, f"defaults of CollectiveOptions missing from the route table: " \
                             f"{sorted(used - named)}"
