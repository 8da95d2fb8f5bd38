"""ARR-COC Serve demo: the Gradio adapter (see demo/app.py)."""
