"""A free TCP port on 127.0.0.1 for a test's server. Importable from every test under tests/pipeline, whose
conftest.py puts this folder on sys.path (pytest's default import mode)."""
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
