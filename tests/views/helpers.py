"""Checks of an exported Perfetto timeline, shared by the export tests."""


def assert_honest_timeline(events: list[dict]) -> None:
    """Every slice nests on its track, each phase inside its step (same track), no collective of zero length,
    estimated collectives named, categorised and argued as such, and every flow a chain across distinct ranks
    in issue order: the first rank to issue only flows out, the last only in, those between both."""
    slices = [e for e in events if e["ph"] == "X"]
    tracks: dict = {}
    for e in slices:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in tracks.values():
        stack: list = []
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1]["ts"] + stack[-1]["dur"], (e, stack[-1])
            stack.append(e)
    steps = {(e["pid"], e["args"]["step"]): e for e in slices if e.get("cat") == "step"}
    for phase in (e for e in slices if e.get("cat") == "phase" and e["args"]["step"] >= 0):
        step = steps[(phase["pid"], phase["args"]["step"])]
        assert phase["tid"] == step["tid"]
        assert step["ts"] <= phase["ts"] and phase["ts"] + phase["dur"] <= step["ts"] + step["dur"], (phase, step)
    collectives = [e for e in slices if e.get("cat", "").startswith("collective")]
    for e in collectives:
        assert e["dur"] > 0, e
        estimated = e["args"]["duration"] == "estimated"
        assert estimated == (e["args"]["duration_us"] is None)
        assert estimated == e["name"].endswith("(estimated)") == (e["cat"] == "collective,estimated")
        if not estimated:
            assert e["dur"] == max(e["args"]["duration_us"], 1.0)
    chains: dict = {}
    for e in collectives:
        if "bind_id" in e:
            chains.setdefault(e["bind_id"], []).append(e)
    for chain in chains.values():
        chain.sort(key=lambda e: (e["ts"], e["pid"]))
        assert len(chain) >= 2 and len({e["pid"] for e in chain}) == len(chain)
        assert len({(e["args"]["pg"], e["args"]["seq"]) for e in chain}) == 1
        directions = [(bool(e.get("flow_in")), bool(e.get("flow_out"))) for e in chain]
        assert directions == [(False, True)] + [(True, True)] * (len(chain) - 2) + [(True, False)]
        assert {e["args"]["last_rank_to_issue"] for e in chain} == {chain[-1]["pid"]}
