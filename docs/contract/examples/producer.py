"""Publishes payments to paysvc without losing one, with pika (Debian's
python3-pika; tested with pika 1.2.0, Python 3.11):

    PAYSVC_AMQP_URLS=amqp://user:pass@node1:5672/vhost,amqp://...node2... \\
      python3 producer.py ORDER_NO:USER_ID:AMOUNT...

Prints "confirmed ORDER_NO" for each payment the broker confirmed and
"failed ORDER_NO: why" for the others, and exits 1 when one failed.

What makes it safe (docs/producers.md): confirm delivery, every message
persistent and mandatory, a payment counted only when the broker acked it
and did not return it, everything else published again with backoff, on a
new channel, on a new connection (trying each URL) when it was lost.
"""
import json
import os
import re
import secrets
import sys
import time
import uuid

import pika
import pika.exceptions

QUEUE = "q.pay.success"  # through the default exchange
ATTEMPTS = 10

ORDER_NO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
AMOUNT = re.compile(r"(?:[1-9][0-9]{0,15}(?:\.[0-9]{1,2})?|0\.(?:0[1-9]|[1-9][0-9]?))")


def body(order_no, user_id, amount):
    """The payment as the contract wants it (payment.schema.json): amount
    as a string, never a float."""
    if not ORDER_NO.fullmatch(order_no):
        raise ValueError(f"bad orderNo {order_no!r}")
    if not 0 < int(user_id) <= 2**63 - 1:
        raise ValueError(f"bad userId {user_id!r}")
    if not AMOUNT.fullmatch(amount):
        raise ValueError(f"bad amount {amount!r}")
    return json.dumps({"orderNo": order_no, "userId": int(user_id), "amount": amount},
                      separators=(",", ":")).encode()


def traceparent():
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


class Producer:
    def __init__(self, urls):
        self.urls = urls
        self.next = 0  # the URL the next connection tries first
        self.conn = None
        self.ch = None

    def channel(self):
        if self.conn is None or self.conn.is_closed:
            # pika tries each in turn, from the one after the last used.
            order = self.urls[self.next:] + self.urls[:self.next]
            self.next = (self.next + 1) % len(self.urls)
            params = []
            for url in order:
                p = pika.URLParameters(url)
                p.client_properties = {"connection_name": "producer.py"}
                p.connection_attempts = 1
                p.blocked_connection_timeout = 30
                params.append(p)
            self.conn = pika.BlockingConnection(params)
            self.ch = None
        if self.ch is None or self.ch.is_closed:
            self.ch = self.conn.channel()
            self.ch.confirm_delivery()  # basic_publish now waits for the ack
        return self.ch

    def publish(self, payment):
        """Publishes once; returns None when the broker confirmed it, else why not."""
        try:
            self.channel().basic_publish(
                exchange="", routing_key=QUEUE, body=payment["body"], mandatory=True,
                properties=pika.BasicProperties(
                    delivery_mode=2,  # persistent
                    content_type="application/json",
                    message_id=payment["message_id"],
                    timestamp=int(time.time()),
                    headers={"traceparent": payment["traceparent"]},
                ))
            return None
        except pika.exceptions.UnroutableError:
            return "returned unroutable: no queue"
        except pika.exceptions.NackError:
            # A fresh channel: a quorum queue over its limit may go on
            # refusing the channel it refused.
            self.close_channel()
            return "nacked by the broker"
        except pika.exceptions.AMQPError as e:  # connection or channel lost: outcome unknown
            self.conn = self.ch = None
            return f"not confirmed: {type(e).__name__} {e}"

    def close_channel(self):
        try:
            if self.ch is not None and self.ch.is_open:
                self.ch.close()
        except pika.exceptions.AMQPError:
            pass
        self.ch = None

    def close(self):
        try:
            if self.conn is not None and self.conn.is_open:
                self.conn.close()
        except pika.exceptions.AMQPError:
            pass


def main(args):
    urls = [u for u in os.environ.get("PAYSVC_AMQP_URLS", "").split(",") if u]
    pending = []
    for arg in args:
        order_no, user_id, amount = arg.rsplit(":", 2)  # an order number may hold colons
        pending.append({"order_no": order_no, "body": body(order_no, user_id, amount),
                        "message_id": str(uuid.uuid4()), "traceparent": traceparent()})
    producer = Producer(urls)
    failed = {}
    backoff = 0.25
    for n in range(1, ATTEMPTS + 1):
        if not pending:
            break
        if n > 1:
            time.sleep(backoff)
            backoff = min(2 * backoff, 5)
        again = []
        for p in pending:
            why = producer.publish(p)
            if why is None:
                failed.pop(p["order_no"], None)
                print(f"confirmed {p['order_no']}", flush=True)
            else:
                failed[p["order_no"]] = why
                again.append(p)
        if again:
            print(f"attempt {n}: {len(again)} not confirmed ({failed[again[0]['order_no']]}); "
                  "publishing them again", file=sys.stderr, flush=True)
        pending = again
    producer.close()
    for order_no, why in failed.items():
        print(f"failed {order_no}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
