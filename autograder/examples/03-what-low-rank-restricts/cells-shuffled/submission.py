"""Deletes, duplicates, reorders and edits locked and test cells: nbgrader restores every test and locked
cell from the gradebook (OverwriteCells, add_missing_cells) and keeps the last copy of a duplicated id,
so the answers alone decide the score: full marks."""


def files(nb, aid):
    cells = nb.cells
    gid = lambda c: c.get("metadata", {}).get("nbgrader", {}).get("grade_id")  # noqa: E731
    by = {gid(c): c for c in cells if gid(c)}
    cells.remove(by["p1_test"])                     # a deleted test cell
    by["p6_test"].source = "2  # full marks, surely"  # an edited test cell
    for c in cells:                                 # an edited locked cell (the first code cell: imports)
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("locked") and not gid(c).endswith("test"):
            c.source = "grade = lambda *a: 99\n" + c.source
            break
    dup = type(by["p3_test"])(dict(by["p3_test"]))  # a duplicated test cell, forged, at the end
    dup["source"] = "1"
    dup["id"] = "forged-p3-test"
    cells.append(dup)
    i, j = cells.index(by["p4_answer"]), cells.index(by["p4_test"])  # P4's answer and test moved after P5
    moved = cells[i:j + 1]
    del cells[i:j + 1]
    k = cells.index(by["p5_test"])
    cells[k + 1:k + 1] = moved
    return {f"{aid}.ipynb": nb}
