"""Host helpers shared by the compat layers."""

from __future__ import annotations

from ..errors import Lazy, check


def paged_row_strides(
    n_pages: int,
    page_size: int,
    page_stride: int,
    token_stride: int,
    name: str,
    page_word: str,
    shown: object,
) -> tuple[int, int, int]:
    """Row addressing of a paged cache [n_pages, page_size, ...] given its page and token
    strides (elements): -> (token stride, page stride in rows, rows spanned).

    The token stride of one-token pages is the page's; a single page's stride is implied.
    Raises InvalidArgumentError (naming `{name}.stride()`, showing `shown`) unless the page
    stride is a positive multiple of the token stride. page_word: "page" or "block".
    """
    if page_size == 1:
        token_stride = page_stride if n_pages > 1 else max(token_stride, 1)
    if n_pages == 1:
        page_stride = token_stride * page_size
    check(
        token_stride > 0 and page_stride > 0 and page_stride % token_stride == 0,
        Lazy(lambda: f"{name}.stride()"),
        Lazy(
            lambda: (
                f"a {page_word} stride that is a positive multiple of the token stride "
                "(call .contiguous())"
            )
        ),
        shown,
    )
    psr = page_stride // token_stride
    return token_stride, psr, (n_pages - 1) * psr + page_size
