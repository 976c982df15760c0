"""The service's tables: articles and their likes.

``Article.like_count`` is a declared counter: a column of ``article`` that triggers on
``article_like`` keep, whatever writes the likes (this service, a bulk statement, psql,
another program). The migrations in ``migrations/versions`` create the tables and install
the counter; ``alembic check`` compares them with these declarations.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Identity, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from pgcounters.contrib.sqlalchemy import counted


class Base(DeclarativeBase):
    pass


class Article(Base):
    __tablename__ = "article"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    likes: Mapped[list[Like]] = relationship(passive_deletes=True)
    # the number of rows of article_like of this article, kept by the triggers
    like_count: Mapped[int] = counted("likes", index=True)


class Like(Base):
    __tablename__ = "article_like"

    article_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("article.id", ondelete="CASCADE"), primary_key=True
    )
    user_name: Mapped[str] = mapped_column(String(100), primary_key=True)
