"""A custom user model with counter columns, and posts counted per user.

``Post`` also points to the stock ``django.contrib.auth`` User: counting per
user without a custom user model is a named counter keyed by the foreign key.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, BaseUserManager
from django.db import models
from django.db.models import Q

from pgcounters.contrib.django import CountField, register_counter


class Member(AbstractBaseUser):
    username = models.CharField(max_length=150, unique=True)
    published_posts = CountField("posts", filter=Q(published=True))
    # direct mode: applied in the writing transaction
    all_posts = CountField("posts", mode="direct")

    USERNAME_FIELD = "username"
    objects = BaseUserManager["Member"]()


class Post(models.Model):
    author = models.ForeignKey(Member, related_name="posts", on_delete=models.CASCADE, null=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        related_name="posts",
        on_delete=models.CASCADE,
        null=True,
    )
    published = models.BooleanField(default=False)


# posts per stock auth User: a named counter keyed by the foreign key
posts_per_user = register_counter("members.posts.per_user", Post, keys=("user",))
