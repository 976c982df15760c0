from blog import views
from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("articles/<int:pk>/", views.article, name="article"),
]
