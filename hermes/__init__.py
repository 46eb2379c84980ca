"""hermes-video: streaming video question answering with a hierarchical KV memory (HERMES).

    import hermes
    with hermes.open("video.mp4", model="micro-llava-onevision") as session:
        print(session.ask("What is moving?", at=12.0).answer)

`hermes.open` is `hermes.pipelines.facade.open_session`, looked up on first use (PEP 562), so
`import hermes` imports neither torch nor the configuration: `hermes-video --help` stays instant.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["open", "__version__"]

if TYPE_CHECKING:
    from hermes.pipelines.facade import open_session as open  # noqa: A004


def __getattr__(name: str):
    if name == "open":
        from hermes.pipelines.facade import open_session

        return open_session
    raise AttributeError(f"module 'hermes' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + ["open"])
