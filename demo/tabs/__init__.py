"""One module per tab of the page (and the API endpoints), assembled by demo/app.py."""
