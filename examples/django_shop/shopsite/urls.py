"""The shop's two ways to place an order (``shop.views``)."""

from django.urls import path
from shop import views

urlpatterns = [
    path("orders/on-commit", views.place_order_on_commit),
    path("orders/atomic", views.place_order_atomic),
]
