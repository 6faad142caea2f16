"""The demo's console: a line from the main thread and a line from a step thread never run
together (a CI run once printed 'demo: runs did not finish within 0 s (--timeout)[  0.17s]
fetched 1 pending orders': the main thread's ``print`` wrote its text and its newline
separately, and a step's line landed between them)."""

import threading

from ductwork import demo


class _SlowConsole:
    """A console that, mid-way through the main thread's line, lets a step thread try to write
    and waits (with a deadline) for it to get in: an unsynchronised writer interleaves here."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.step_tried = threading.Event()
        self.step_wrote = threading.Event()
        self.main_mid_line = threading.Event()

    def write(self, text: str) -> int:
        self.parts.append(text)
        if threading.current_thread() is threading.main_thread() and not self.main_mid_line.is_set():
            self.main_mid_line.set()
            self.step_tried.wait(5)
            self.step_wrote.wait(0.5)  # a racing writer gets in here; a locked one cannot
        else:
            self.step_wrote.set()
        return len(text)

    def flush(self) -> None:
        pass


def test_a_main_thread_line_and_a_step_line_are_written_whole(monkeypatch):
    console = _SlowConsole()
    monkeypatch.setattr(demo.sys, "stdout", console)

    def step() -> None:
        console.main_mid_line.wait(5)
        console.step_tried.set()
        demo._say("fetched 1 pending orders")

    other = threading.Thread(target=step)
    other.start()
    demo._write("demo: runs did not finish within 0 s (--timeout)")
    other.join(5)
    lines = "".join(console.parts).splitlines()
    assert "demo: runs did not finish within 0 s (--timeout)" in lines
    assert any(line.endswith("] fetched 1 pending orders") for line in lines), lines
    assert len(lines) == 2, lines
