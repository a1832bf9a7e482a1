def compare_versions(a, b):
    """-1, 0 or 1 as release a comes before, is the same as, or comes after release b."""
    # Typical mistake: the version strings are compared as text, so "0.9" comes after "0.10".
    return int(a > b) - int(a < b)
