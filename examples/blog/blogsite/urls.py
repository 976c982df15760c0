from blog import views
from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("", views.article_list, name="article-list"),
    path("admin/", admin.site.urls),
    path("articles/<int:pk>/", views.article, name="article"),
    path("articles/<int:pk>/detail/", views.article_detail, name="article-detail"),
    path("articles/<int:pk>/activity/", views.article_activity, name="article-activity"),
    path("authors/", views.authors, name="authors"),
    path("tags/", views.tags, name="tags"),
    path("tags/<int:pk>/", views.tag_detail, name="tag-detail"),
    path("users/<int:pk>/notifications/", views.notifications, name="notifications"),
    path("notifications/<int:pk>/read/", views.mark_read, name="mark-read"),
    path("api/top-articles/", views.api_top_articles, name="api-top-articles"),
]
