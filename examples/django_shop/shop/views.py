"""``POST /orders/on-commit`` and ``POST /orders/atomic`` with ``item=…``: place an order,
its run started one of the two ways of ``shop.orders``."""

from django.http import HttpRequest, HttpResponse, JsonResponse

from shop import orders


def place_order_on_commit(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponse(status=405)
    order = orders.place_order_on_commit(request.POST["item"])
    return JsonResponse({"order": order.pk, "run": order.run_id}, status=201)


def place_order_atomic(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponse(status=405)
    order = orders.place_order_atomic(request.POST["item"])
    return JsonResponse({"order": order.pk, "run": order.run_id}, status=201)
