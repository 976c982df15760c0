"""The newsroom service: FastAPI, async SQLAlchemy and pgcounters on psycopg 3.

* ``GET /articles/{id}`` counts a view: an event counter (``article.views``), incremented
  through an :class:`~pgcounters.AsyncBatchingCounters` that writes the views of every
  request in one statement a second;
* ``PUT`` / ``DELETE /articles/{id}/likes/{user}`` like and unlike: rows of
  ``article_like``, counted into ``article.like_count`` by the triggers of the declared
  counter (the request writes only its row);
* ``/api/...`` is limited to a number of calls per API key (``X-Api-Key``) per day: a
  pgcounters quota through the :class:`~pgcounters.contrib.starlette.RateLimit`
  dependency, answering ``429`` with ``Retry-After`` and the ``RateLimit-*`` headers;
* an :class:`~pgcounters.AsyncWorker` runs in the application's lifespan and applies the
  queued deltas to the counters (``like_count`` follows the likes within milliseconds).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from newsroom.db import API_QUOTA, VIEWS, engine_for
from newsroom.models import Article, Like
from pgcounters import AsyncBatchingCounters, AsyncCounters, AsyncQuotas, AsyncWorker
from pgcounters.contrib.sqlalchemy import exact
from pgcounters.contrib.starlette import RateLimit


@dataclass(frozen=True)
class Settings:
    """``dsn``: the database. ``api_rate``: the calls an API key may make
    (``"1000/day"``). ``worker``: drain the counters' queues in the lifespan (False: a
    ``pgcounters worker`` of its own does). ``views_interval``: seconds between two
    writes of the buffered views."""

    dsn: str
    api_rate: str = "1000/day"
    worker: bool = True
    views_interval: float = 1.0


@dataclass(frozen=True)
class Resources:
    """What the lifespan opens, for the endpoints (``app.state.newsroom``)."""

    sessions: async_sessionmaker[AsyncSession]
    counters: AsyncCounters
    views: AsyncBatchingCounters


class NewArticle(BaseModel):
    title: str = Field(min_length=1, max_length=200)


class ArticleOut(BaseModel):
    id: int
    title: str
    likes: int  # exact: the stored column plus the likes the worker has not applied yet
    views: int  # exact: the database's count plus the views still buffered


class Stats(BaseModel):
    id: int
    likes: int
    likes_stored: int  # the column as stored: behind `likes` until the worker applies it
    views: int


class LikeOut(BaseModel):
    article_id: int
    user: str
    changed: bool  # False: the like was already there (or already gone)


class Ranked(BaseModel):
    id: int
    count: int


def resources(request: Request) -> Resources:
    found: Resources = request.app.state.newsroom
    return found


Found = Annotated[Resources, Depends(resources)]


async def session(res: Found) -> AsyncIterator[AsyncSession]:
    async with res.sessions() as opened:
        yield opened


Session = Annotated[AsyncSession, Depends(session)]


async def _article(db: AsyncSession, article_id: int) -> tuple[Article, int]:
    """The article and its exact number of likes, in one statement; 404 when absent."""
    row = (
        await db.execute(select(Article, exact(Article.like_count)).where(Article.id == article_id))
    ).one_or_none()
    if row is None:
        raise HTTPException(status_code=404, detail=f"no article {article_id}")
    return row[0], int(row[1])


def create_app(settings: Settings) -> FastAPI:
    """The application on ``settings.dsn`` (migrated: ``alembic upgrade head``)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # closed in the reverse order on shutdown: the views still buffered are written,
        # then the worker stops after its current batch, then the connections close
        async with contextlib.AsyncExitStack() as stack:
            engine = engine_for(settings.dsn)
            stack.push_async_callback(engine.dispose)
            pool = AsyncConnectionPool(settings.dsn, min_size=2, max_size=8, open=False)
            await stack.enter_async_context(pool)
            if settings.worker:
                await stack.enter_async_context(AsyncWorker(settings.dsn))
            views = AsyncBatchingCounters(pool, interval=settings.views_interval)
            await stack.enter_async_context(views)
            app.state.quotas = AsyncQuotas(pool)  # where RateLimit finds its quotas
            app.state.newsroom = Resources(
                sessions=async_sessionmaker(engine, expire_on_commit=False),
                counters=AsyncCounters(pool),
                views=views,
            )
            yield

    app = FastAPI(title="newsroom", lifespan=lifespan)

    @app.post("/articles", status_code=201)
    async def create_article(new: NewArticle, db: Session) -> ArticleOut:
        article = Article(title=new.title)
        db.add(article)
        await db.commit()
        return ArticleOut(id=article.id, title=article.title, likes=0, views=0)

    @app.get("/articles/top")
    async def top(res: Found, db: Session, by: Literal["likes", "views"] = "likes") -> list[Ranked]:
        """The 10 articles with the most likes (the counter column's index, no count of
        the likes) or views, as the worker has applied them."""
        if by == "views":
            ranked = await res.counters.top(VIEWS, 10)
            # keys of article.views are one bigint: (article_id,)
            return [Ranked(id=k, count=n) for (k,), n in ranked if isinstance(k, int)]
        query = select(Article.id, Article.like_count).order_by(
            Article.like_count.desc(), Article.id
        )
        rows = (await db.execute(query.limit(10))).all()
        return [Ranked(id=article_id, count=count) for article_id, count in rows]

    @app.get("/articles/{article_id}")
    async def read_article(article_id: int, db: Session, res: Found) -> ArticleOut:
        """The article, and one more view of it."""
        article, likes = await _article(db, article_id)
        await res.views.incr(VIEWS, article_id)
        views = await res.views.get(VIEWS, article_id)
        return ArticleOut(id=article.id, title=article.title, likes=likes, views=views)

    @app.put("/articles/{article_id}/likes/{user}")
    async def like(article_id: int, user: str, db: Session) -> LikeOut:
        """``user`` likes the article (once: a second like changes nothing)."""
        await _article(db, article_id)
        added = await db.execute(
            insert(Like)
            .values(article_id=article_id, user_name=user)
            .on_conflict_do_nothing()
            .returning(Like.article_id)
        )
        changed = added.first() is not None
        await db.commit()
        return LikeOut(article_id=article_id, user=user, changed=changed)

    @app.delete("/articles/{article_id}/likes/{user}")
    async def unlike(article_id: int, user: str, db: Session) -> LikeOut:
        removed = await db.execute(
            delete(Like)
            .where(Like.article_id == article_id, Like.user_name == user)
            .returning(Like.article_id)
        )
        changed = removed.first() is not None
        await db.commit()
        return LikeOut(article_id=article_id, user=user, changed=changed)

    # the public API: `api_rate` calls per API key (per client address without one)
    api = APIRouter(
        prefix="/api",
        dependencies=[
            Depends(RateLimit(settings.api_rate, key="header:X-Api-Key", quota=API_QUOTA))
        ],
    )

    @api.get("/articles/{article_id}/stats")
    async def stats(article_id: int, db: Session, res: Found) -> Stats:
        article, likes = await _article(db, article_id)
        views = await res.views.get(VIEWS, article_id)
        return Stats(id=article.id, likes=likes, likes_stored=article.like_count, views=views)

    app.include_router(api)
    return app
