"""`OwnedDirs` against a plain model of a tree: it may say "absent" only of a name that
does not exist, and must say it of every name never made in a directory this mount made
(that is what saves the GCS lookups). Through a real mount: test_mount_writeback.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.core.owned import OwnedDirs

NAMES = ("a", "b", "c")


def parent(path: str) -> str:
    return path.rpartition("/")[0]


def below(path: str, tree: dict[str, bool] | set[str]) -> list[str]:
    return sorted(p for p in tree if p == path or p.startswith(path + "/"))


@settings(max_examples=400)
@given(st.data())
def test_absent_only_for_what_does_not_exist(data: st.DataObject) -> None:
    owned = OwnedDirs()
    tree: dict[str, bool] = {"pre": True}  # path -> is a directory; "pre" was in GCS already
    made_here: set[str] = set()  # directories this mount made (and still has)
    for _ in range(data.draw(st.integers(0, 30))):
        dirs = ["", *sorted(p for p, is_dir in tree.items() if is_dir)]
        where = data.draw(st.sampled_from(dirs))
        name = data.draw(st.sampled_from(NAMES))
        path = f"{where}/{name}" if where else name
        op = data.draw(st.sampled_from(["mkdir", "create", "unlink", "rmdir", "rename"]))
        if op in ("mkdir", "create") and path not in tree:
            tree[path] = op == "mkdir"
            if op == "mkdir":
                owned.made(path)
                made_here.add(path)
            else:
                owned.added(path)
        elif op == "unlink" and tree.get(path) is False:
            del tree[path]
            owned.removed(path)
        elif op == "rmdir" and tree.get(path) is True and below(path, tree) == [path]:
            del tree[path]
            made_here.discard(path)
            owned.removed(path, is_dir=True)
        elif op == "rename" and len(tree) > 1:
            source = data.draw(st.sampled_from(sorted(p for p in tree if p != "pre")))
            if path in tree or (path + "/").startswith(source + "/"):
                continue
            is_dir = tree[source]
            for p in below(source, tree):
                tree[path + p[len(source) :]] = tree.pop(p)
            for p in below(source, made_here):
                made_here.discard(p)
                made_here.add(path + p[len(source) :])
            owned.moved(source, path, is_dir=is_dir)
        for d in ["", *tree]:
            for n in NAMES:
                candidate = f"{d}/{n}" if d else n
                if owned.absent(candidate):
                    assert candidate not in tree, candidate
                elif parent(candidate) in made_here and candidate not in tree:
                    raise AssertionError(f"{candidate} is not answered locally")
