"""Prints the command README.md marks with ``<!-- command: NAME -->`` (the fenced block after
the marker), so CI runs the README's commands as written: README and CI cannot drift apart."""
import os
import re
import sys

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def readme_command(name: str) -> str:
    text = open(README, encoding="utf-8").read()
    found = re.findall(rf"<!-- command: {re.escape(name)} -->\n```bash\n(.*?)```", text, re.S)
    if len(found) != 1:
        raise SystemExit(f"README.md has {len(found)} blocks marked '<!-- command: {name} -->', "
                         "expected exactly one")
    lines = [line for line in found[0].splitlines() if line.strip() and not line.startswith("#")]
    if len(lines) != 1:
        raise SystemExit(f"README.md's '{name}' block holds {len(lines)} commands, expected one")
    return lines[0]


if __name__ == "__main__":
    print(readme_command(sys.argv[1]))
