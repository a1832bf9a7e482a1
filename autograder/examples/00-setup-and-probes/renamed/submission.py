def files(nb, aid):
    """The right notebook under another name."""
    return {"my-lesson-00.ipynb": nb}
