def first_word(text):
    """The generated answer's first word, lower-cased and without surrounding punctuation."""
    # Typical mistake: the first word is lower-cased but keeps its punctuation ("thermal." is no label).
    words = text.strip().lower().split()
    return words[0] if words else ""
