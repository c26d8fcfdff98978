"""python -m pipeline.emulator --host 127.0.0.1 --port PORT --model NAME [--config FILE.yaml] [--<field> VALUE ...]"""
from __future__ import annotations

import errno
import socket
import sys

from pipeline.config.emulator import ConfigError, config_from_argv
from pipeline.emulator.cyclelog import CycleLogError
from pipeline.emulator.tokens import TokenizerError


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = config_from_argv(argv)
        from pipeline.emulator.server import serve  # aiohttp and the cost model load only once config is good

        serve(cfg)
    except (ConfigError, TokenizerError, CycleLogError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the address: a host that does not resolve, a port taken or not ours to bind
        if not isinstance(e, socket.gaierror) and e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise
        print(f"error: cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
