"""The launcher's own options, which sglang's parser would reject: `--vattn-base` (vattn.sglang.base) and
`--vattn-dummy-init` (vattn.sglang.dummy_init). Each is removed from argv and exported as its env variable,
which sglang's scheduler processes (started with spawn) inherit."""
from __future__ import annotations

from vattn.sglang import base, dummy_init

OPTIONS = {base.FLAG: (base.ENV, base.check, base.BASES), dummy_init.FLAG: (dummy_init.ENV, dummy_init.check,
                                                                            dummy_init.MODES)}


def strip(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """argv without the launcher's options (`--flag X` or `--flag=X`), and {env name: checked value} of those
    given; an option given twice keeps the last, as with argparse."""
    rest, env = [], {}
    i = 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag not in OPTIONS:
            rest.append(argv[i])
            i += 1
            continue
        name, check, allowed = OPTIONS[flag]
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ValueError(f"{flag}: needs a value; allowed: {', '.join(allowed)}")
            value = argv[i + 1]
            i += 1
        env[name] = check(value)
        i += 1
    return rest, env
