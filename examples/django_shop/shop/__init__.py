"""The shop: an ``Order`` model whose pipeline is triggered with the order (see ``shop.orders``)."""
