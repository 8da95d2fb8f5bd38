"""arrcoc demo [--port N] [--host H] [--share]: the Gradio demo (in-process executor unless
ARRCOC_SERVICE__BROKER_URL points at a Redis broker)."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

from ..settings import DTYPES

if TYPE_CHECKING:
    import gradio as gr


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="start the Gradio demo (http://127.0.0.1:7860)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    p.add_argument(
        "--host",
        default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        help="interface to listen on (0.0.0.0 for every interface)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="auto: bfloat16 for CLIP on a GPU, else float32; float32: float32 everywhere (ARRCOC_ENGINE__DTYPE)",
    )
    p.set_defaults(func=run)


def stop_on_sigterm() -> None:
    """SIGTERM (docker stop, systemd, a Space's restart) stops the demo as Ctrl+C does: it raises
    KeyboardInterrupt, on which Gradio's launch() closes the server and returns. Without a handler a
    demo that is PID 1 in a container ignores SIGTERM until the engine kills it."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def serve(blocks: gr.Blocks, **kwargs: Any) -> int:
    """The demo's launch, blocking until Ctrl+C or SIGTERM; 0 once its server is closed."""
    from demo.app import launch

    try:
        launch(blocks, **kwargs)
    except KeyboardInterrupt:  # the signal came while launch() was still starting the server
        pass
    finally:
        blocks.close()
    return 0


def run(args) -> int:
    import logging

    stop_on_sigterm()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.dtype:  # the demo reads its settings from the environment
        from ..settings import get_settings

        os.environ["ARRCOC_ENGINE__DTYPE"] = args.dtype
        get_settings.cache_clear()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from demo.app import build_demo

    print(f"ARR-COC demo on http://{args.host}:{args.port} (Ctrl+C to stop)")
    return serve(build_demo(), server_name=args.host, server_port=args.port)
