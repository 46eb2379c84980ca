"""The README's Serving section, run as written against a real `hermes-video serve`.

The section's bash block is one script. The test starts the server itself (its command from the
README, on a free port instead of 8000, with the key in HERMES_API_KEY), drops the lines that start
the server, wait for it or make up a new key, and runs the rest with bash `set -e` in a fresh folder:
every `curl -f` must succeed. The one change: the events request, which never ends by itself, stops
after `--max-time` with curl's exit code 28, which is accepted. The section's `openai` client example
(its python block) runs too, before the stream is closed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from live_fixtures import free_port  # noqa: E402
from serve_fixtures import KEY, ServeProcess  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"
pytestmark = pytest.mark.slow


def serving_section() -> str:
    return README.read_text().split("## Serving", 1)[1].split("\n## ", 1)[0]


def serving_script() -> tuple[str, list[str]]:
    """(the serve command, the other commands) of the Serving section's second bash block."""
    section = serving_section()
    block = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[1]
    block = re.sub(r"\\\n\s*", " ", block)
    serve, commands = None, []
    for line in block.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("hermes-video serve"):
            serve = line
        elif not line.startswith(("export HERMES_API_KEY", "sleep ")):
            commands.append(line)
    assert serve is not None and commands
    return serve, commands


def test_the_readme_serving_commands_run(tmp_path):
    serve_line, commands = serving_script()
    argv = shlex.split(serve_line.rstrip("&").strip())[2:]  # after `hermes-video serve`
    argv = [a.replace("serve-memory", str(tmp_path / "serve-memory")) for a in argv]
    port = free_port()
    server = ServeProcess([a for a in argv if a not in ("--model", "tiny-llava-onevision")], port=port)
    try:
        server.start()
        lines = ["set -e"]
        for command in commands:
            command = command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            if "--max-time" in command:
                command += " || [ $? -eq 28 ]"  # the events stream stopped by --max-time
            if "-X DELETE" in command:  # the python example asks the stream first
                python = re.findall(r"```python\n(.*?)```", serving_section(), flags=re.S)[0]
                python = python.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                lines += ["echo '--openai--'", f"python - <<'PY'\n{python}PY"]
            lines.append(command)
        env = {**os.environ, "HERMES_API_KEY": KEY, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out = done.stdout
        assert '"name":"door"' in out
        assert "event: token" in out and "event: answer" in out
        assert "hermes_streams 1" in out
        assert '"object":"chat.completion"' in out and '{"status":"ready"}' in out
        # the openai client's answer is the native question's (same frames, greedy)
        printed = out.split("--openai--\n", 1)[1].split('{"id":"door"', 1)[0][:-1]
        assert f'"answer":{json.dumps(printed, ensure_ascii=False)}' in out
        # the question saw the one frame pushed before it (curl prints the JSON bodies back to back)
        assert out.count('"frames_seen":1,') >= 1 and '"last_frame_t_s":0.5' in out
        assert '"status":"closed"' in out
    finally:
        server.stop()
