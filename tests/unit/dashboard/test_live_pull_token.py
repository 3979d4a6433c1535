"""The Triage page's pull from a job's debug server is a Dash callback: with a token, a request without it is
refused before anything is fetched from the job (the debug server itself has no authentication)."""

from pathlib import Path

import pytest

from diag.dashboard import live_pull
from diag.dashboard.app import TOKEN_HEADER
from diag.triage import debug_pull

SAMPLE = Path(__file__).resolve().parents[3] / "sample_traces" / "straggler"
TOKEN = "tok-live-pull"

# what the page sends when the pull button is pressed (Dash's callback request)
PRESS_PULL = {
    "output": f"{live_pull.RESULT_ID}.children",
    "outputs": {"id": live_pull.RESULT_ID, "property": "children"},
    "inputs": [
        {"id": live_pull.PULL_ID, "property": "n_clicks", "value": 1},
        {"id": live_pull.PROFILE_ID, "property": "n_clicks", "value": None},
    ],
    "changedPropIds": [f"{live_pull.PULL_ID}.n_clicks"],
    "state": [
        {"id": live_pull.RANKS_ID, "property": "value", "value": None},
        {"id": live_pull.SECONDS_ID, "property": "value", "value": 2},
        {"id": "selected-rank", "property": "data", "value": None},
    ],
}


@pytest.fixture
def pulls(monkeypatch, tmp_path):
    """The pulls the dashboard asked for (none reach a job: each is refused as a server that is down)."""
    asked = []

    def pull(url, directory, **_):
        asked.append(url)
        raise debug_pull.PullError("no job here")

    monkeypatch.setattr(debug_pull, "pull", pull)
    live_pull.set_debug_server("http://127.0.0.1:25999", tmp_path / "pulled")
    yield asked
    live_pull.set_debug_server(None)


def test_a_pull_without_the_token_is_refused_before_the_job_is_asked(pulls, dashboard_app):
    client = dashboard_app(SAMPLE, token=TOKEN).server.test_client()
    refused = client.post("/_dash-update-component", json=PRESS_PULL)
    assert refused.status_code == 403 and pulls == []
    wrong = client.post("/_dash-update-component", json=PRESS_PULL, headers={TOKEN_HEADER: "not-" + TOKEN})
    assert wrong.status_code == 403 and pulls == []
    done = client.post("/_dash-update-component", json=PRESS_PULL, headers={TOKEN_HEADER: TOKEN})
    assert done.status_code == 200 and pulls == ["http://127.0.0.1:25999"]
    assert "Could not pull: no job here" in done.get_data(as_text=True)
