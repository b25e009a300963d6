"""A worker app whose handler fails with an error text full of markup and terminal control
characters (for the CLI's escaping tests): every message is dead-lettered on its first try."""

from tableq.worker import App

app = App(poll_interval_max=0.2)
HOSTILE_ERROR = ("boom [/] [bold]x \x1b]0;pwned\x07 \x1b[2J \x9b31m \u202eevil\n"
                 "last [/] line \x1b[31m")


@app.handler("hostile[/]", max_attempts=1)
def fail(message) -> None:
    raise ValueError(f"{message.payload} {HOSTILE_ERROR}")
