"""Hugging Face Spaces entry point (README front matter: app_file: app.py).

Spaces runs `python app.py`; the demo uses the in-process executor there (no Redis needed).
"""

import os

# On a Space the hub is reachable: serve CLIP ViT-B/16 (objects), unless the Space's settings name
# another variant. This file is the Space's launcher, as compose.yaml is the containers'.
if os.environ.get("SPACE_ID"):
    os.environ.setdefault("ARRCOC_VARIANT", "arrcoc-clip-b16")
    # the Space's proxy reaches the container from the platform's private network: its
    # X-Forwarded-For names the visitor, so rate limits count visitors, not the proxy
    os.environ.setdefault("ARRCOC_TRUSTED_PROXIES", "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,127.0.0.1,::1")

from demo.app import build_demo, launch  # noqa: E402

demo = build_demo()  # building the page is cheap: the model loads on the first run

if __name__ == "__main__":
    launch(demo, server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"))
