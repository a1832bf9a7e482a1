def files(nb, aid):
    """An empty file in place of the notebook."""
    return {f"{aid}.ipynb": b""}
