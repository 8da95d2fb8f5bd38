"""Hugging Face Spaces entry point (README front matter: app_file: app.py).

Spaces runs `python app.py`; the demo uses the in-process executor there (no Redis needed).
"""

import os

from demo.app import build_demo, launch

demo = build_demo()  # building the page is cheap: the model loads on the first run

if __name__ == "__main__":
    launch(demo, server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"))
