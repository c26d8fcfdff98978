"""`python -m vattn.sglang.launch [--vattn-base fa3|flashinfer|triton] [--vattn-dummy-init sglang|scaled]
<sglang launch_server args>`: register vattn, then run sglang.

The launcher's options (vattn.sglang.options) are removed from argv before sglang parses it and exported
as env (`VATTN_BASE`: without it the base is sglang's own default for the model on that GPU;
`VATTN_DUMMY_INIT`: how `--load-format dummy` fills the weights), which sglang's scheduler processes
inherit. The rest of argv reaches sglang's server unchanged: main() does what `python -m
sglang.launch_server` does (load sglang's plugins, parse, run_server), with vattn registered first.

Why registration happens at import: sglang starts its scheduler processes with the "spawn"
method, and a spawned child re-imports the parent's __main__ module (this one, as __mp_main__)
without running its main block. Registering at import puts `vattn` into the child's backend
registry before the child builds its attention backends, and the dummy-weight patch into its model
loader.

Without the launcher: installing this package declares an `sglang.srt.plugins` entry point
(`vattn.sglang:register`), which sglang's load_plugins() runs in `python -m sglang.launch_server`
and in each scheduler process, so `--attention-backend vattn` works there too (unless
`SGLANG_PLUGINS` lists plugins and omits `vattn`). The launcher's own flags do not: set `VATTN_BASE`
instead of `--vattn-base`; the dummy-weight patch is the launcher's only.
"""
from __future__ import annotations

import os
import sys

from vattn.sglang import dummy_init, options, register

register()
dummy_init.install()


def main(argv: list[str] | None = None) -> None:
    from sglang import launch_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    args = export_options(sys.argv[1:] if argv is None else list(argv))
    load_plugins()
    server_args = prepare_server_args(args)
    try:
        launch_server.run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def export_options(argv: list[str]) -> list[str]:
    """Strip the launcher's options from argv; export them for the scheduler children (and install the
    dummy-weight patch here too, where sglang may load the model in this process)."""
    rest, env = options.strip(argv)
    os.environ.update(env)
    dummy_init.install()
    return rest


if __name__ == "__main__":
    main()
