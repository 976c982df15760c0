"""SQLAlchemy 2 declarative models with counted columns, for the tests of the integration."""

from __future__ import annotations

from decimal import Decimal

from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import ForeignKey, Numeric, String
from sqlalchemy.engine import URL
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from pgcounters.contrib.sqlalchemy import counted


class Base(DeclarativeBase):
    pass


class Article(Base):
    __tablename__ = "sa_article"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200), default="")
    comments: Mapped[list[Comment]] = relationship(back_populates="article", passive_deletes=True)
    comment_count: Mapped[int] = counted("comments")
    public_comments: Mapped[int] = counted("comments", filter=lambda c: c.status == "public")
    score_total: Mapped[int] = counted("comments", sum="score")
    amount_total: Mapped[Decimal] = counted("comments", sum="amount", decimal_places=2)
    direct_count: Mapped[int] = counted("comments", mode="direct", name="sa.article.direct")


class Comment(Base):
    __tablename__ = "sa_comment"

    id: Mapped[int] = mapped_column(primary_key=True)
    article_id: Mapped[int | None] = mapped_column(
        ForeignKey("sa_article.id", ondelete="CASCADE"), index=True
    )
    status: Mapped[str] = mapped_column(String(20), default="public")
    score: Mapped[int] = mapped_column(default=0)
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2), default=Decimal("0.00"))
    article: Mapped[Article | None] = relationship(back_populates="comments")


class UnloggedBase(DeclarativeBase):
    """Models of their own metadata: an unlogged counter (read exactly on the primary only)."""


class Post(UnloggedBase):
    __tablename__ = "sa_fast_post"

    id: Mapped[int] = mapped_column(primary_key=True)
    replies: Mapped[list[Reply]] = relationship()
    reply_count: Mapped[int] = counted("replies", mode="unlogged")


class Reply(UnloggedBase):
    __tablename__ = "sa_fast_reply"

    id: Mapped[int] = mapped_column(primary_key=True)
    post_id: Mapped[int] = mapped_column(ForeignKey("sa_fast_post.id"))


COUNTED = ("comment_count", "public_comments", "score_total", "amount_total", "direct_count")


def url(dsn: str, driver: str = "postgresql+psycopg") -> URL:
    """A SQLAlchemy URL of a libpq DSN (what the test fixtures give)."""
    params = conninfo_to_dict(dsn)
    return URL.create(
        driver,
        username=str(params.get("user")) if params.get("user") else None,
        password=str(params.get("password")) if params.get("password") else None,
        host=str(params.get("host")) if params.get("host") else None,
        port=int(str(params["port"])) if params.get("port") else None,
        database=str(params.get("dbname")) if params.get("dbname") else None,
    )
