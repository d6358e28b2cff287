"""The docs tell the truth about the command line, and the README stays short with working links.

Every long flag `layup COMMAND --help` prints must appear in docs/cli.md's section for that
command (`## `layup COMMAND``), and every flag a row of that section's tables names must be one
the command takes. The README is at most 160 lines, and the relative links of the README, docs/
and bench/ resolve (to a file, and where they name an anchor, to a heading of that file).
"""
import re
import subprocess

import pytest

from paths import BUILD_DIR, REPO

CLI_DOC = REPO / "docs" / "cli.md"
README = REPO / "README.md"
README_MAX_LINES = 160
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def layup_help(*command):
    path = BUILD_DIR / "layup"
    assert path.exists(), f"{path} is missing: build layup first (cmake --build {BUILD_DIR})"
    result = subprocess.run([str(path), *command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0, f"layup {' '.join(command)} --help failed:\n{result.stderr}"
    return result.stdout


def listed_commands():
    """The subcommands `layup --help` lists, in its order; none when layup is not built (the tests
    below then fail on the top-level case, saying so)."""
    if not (BUILD_DIR / "layup").exists():
        return []
    listed, inside = [], False
    for line in layup_help().splitlines():
        if line.startswith("Subcommands:"):
            inside = True
        elif inside and re.match(r"^  \S", line):
            listed.append(line.split()[0])
    return listed


def help_flags(command):
    """The long flags `layup COMMAND --help` prints (for `layup` itself: its options, not the
    flags its list of subcommands mentions)."""
    text = layup_help(*([command] if command else [])).split("Subcommands:")[0]
    return set(FLAG.findall(text))


# "" is `layup` itself (--version); then every subcommand its --help lists.
COMMANDS = [""] + listed_commands()


def sections(text):
    """Level-2 headings of a markdown text -> the text under each, up to the next one."""
    found, name, lines = {}, None, []
    for line in text.splitlines():
        if line.startswith("## "):
            if name is not None:
                found[name] = "\n".join(lines)
            name, lines = line[3:].strip(), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        found[name] = "\n".join(lines)
    return found


def command_section(command):
    heading = f"`layup {command}`" if command else "`layup`"
    found = sections(CLI_DOC.read_text())
    assert heading in found, f"docs/cli.md has no section '## {heading}'"
    return found[heading]


def table_flags(section):
    """Flags named in the first cell of the section's table rows."""
    flags = set()
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            flags.update(FLAG.findall(cells[1]))
    return flags


def test_subcommands_are_listed():
    layup_help()  # fails, saying so, where layup is not built
    assert len(COMMANDS) > 1, "layup --help lists no subcommands"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "layup")
def test_every_flag_of_the_help_is_documented(command):
    printed = help_flags(command) - {"--help"}
    section = command_section(command)
    missing = sorted(flag for flag in printed if not re.search(
        rf"(?<![\w-]){re.escape(flag)}(?![\w-])", section))
    name = f"layup {command}".strip()
    assert not missing, f"`{name} --help` prints {missing}, which docs/cli.md's section " \
                        f"'## `{name}`' does not mention"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "layup")
def test_every_documented_flag_exists(command):
    printed = help_flags(command)
    documented = table_flags(command_section(command))
    extra = sorted(documented - printed)
    name = f"layup {command}".strip()
    assert not extra, f"docs/cli.md's table for `{name}` names {extra}, which " \
                      f"`{name} --help` does not print"


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, \
        f"README.md has {lines} lines; keep it to {README_MAX_LINES} and move details to docs/"


def github_anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    names, seen, fence = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        match = None if fence else re.match(r"^#{1,6} (.*)", line)
        if match:
            anchor = github_anchor(match.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            names.add(anchor if count == 0 else f"{anchor}-{count}")
    return names


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files():
    return [README, *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "bench").rglob("*.md"))]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    broken = []
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{path.relative_to(REPO)}: broken links: {broken}"


# "  --lr <finite number > 0> [default: 0.003]  Peak learning rate": a range may hold '>', so it
# ends at the '>' that its default, REQUIRED, a list's "...", the description (a capital letter),
# two spaces or the line's end follows.
HELP_ROW = re.compile(r"^  (?:-\w,)?(--[a-z0-9-]+)"
                      r"(?: <(.+?)>(?= \[default: | REQUIRED| \(or | \.\.\.|\s*$| {2,}|\s+[A-Z]))?"
                      r"(?: \.\.\.)?(?: \[default: (.*?)\](?=$| ))?")


def help_rows(command):
    """--flag -> (the values it takes, its default) as `layup COMMAND --help` prints them."""
    rows = {}
    for line in layup_help(command).splitlines():
        match = HELP_ROW.match(line)
        if match and match.group(1) != "--help":
            rows[match.group(1)] = (match.group(2) or "", match.group(3) or "")
    return rows


def doc_rows(command):
    """--flag -> (value cell, default cell) of docs/cli.md's table for the command, backticks
    dropped; a row naming several flags gives each the same cells."""
    rows = {}
    for line in command_section(command).splitlines():
        cells = [cell.strip().replace("`", "") for cell in line.split("|")]
        if line.startswith("|") and len(cells) > 4:
            for flag in FLAG.findall(cells[1]):
                rows[flag] = (cells[2], cells[3])
    return rows


@pytest.mark.parametrize("command", COMMANDS[1:])
def test_help_and_docs_agree_on_every_range_and_default(command):
    """Each flag's values are one text in the code (--help prints it between < >) and in the docs'
    value column; the docs' default starts with the default --help prints, or is 'none'/'off'
    where --help prints none (a flag without a value is 'off')."""
    documented = doc_rows(command)
    wrong = []
    for flag, (values, default) in help_rows(command).items():
        if flag not in documented:
            continue  # test_every_flag_of_the_help_is_documented says so
        doc_values, doc_default = documented[flag]
        if doc_values != values:
            wrong.append(f"{flag}: --help takes <{values}>, the docs '{doc_values}'")
        if default and not doc_default.startswith(default):
            wrong.append(f"{flag}: --help's default is '{default}', the docs' '{doc_default}'")
        if not default and doc_default not in ("none", "off", "required"):
            wrong.append(f"{flag}: --help prints no default, the docs say '{doc_default}'")
    assert not wrong, f"`layup {command} --help` and docs/cli.md disagree:\n" + "\n".join(wrong)
