// Publishes payments to paysvc without losing one, with amqplib
// (npm install amqplib; tested with 2.3.1, Node 20):
//
//   PAYSVC_AMQP_URLS=amqp://user:pass@node1:5672/vhost,amqp://...node2... \
//     node producer.js ORDER_NO:USER_ID:AMOUNT...
//
// Prints "confirmed ORDER_NO" for each payment the broker confirmed and
// "failed ORDER_NO: why" for the others, and exits 1 when one failed.
//
// What makes it safe (docs/producers.md): a confirm channel, every message
// persistent and mandatory, a payment counted only when the broker acked it
// and did not return it, everything else published again with backoff, on
// a new channel, on a new connection (trying each URL) when it was lost.
'use strict';

const amqp = require('amqplib');
const crypto = require('node:crypto');

const QUEUE = 'q.pay.success'; // through the default exchange
const ATTEMPTS = 10;

// body writes the payment as the contract wants it (payment.schema.json):
// amount as a string, userId as the digits given. JSON.stringify of a
// Number loses digits past 2^53, so the id is checked and spliced in.
function body(orderNo, userId, amount) {
  if (!/^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/.test(orderNo)) throw new Error(`bad orderNo ${orderNo}`);
  if (!/^[1-9][0-9]{0,18}$/.test(userId) || BigInt(userId) > 9223372036854775807n) throw new Error(`bad userId ${userId}`);
  if (!/^(?:[1-9][0-9]{0,15}(?:\.[0-9]{1,2})?|0\.(?:0[1-9]|[1-9][0-9]?))$/.test(amount)) throw new Error(`bad amount ${amount}`);
  return Buffer.from(`{"orderNo":${JSON.stringify(orderNo)},"userId":${userId},"amount":${JSON.stringify(amount)}}`);
}

function traceparent() {
  return `00-${crypto.randomBytes(16).toString('hex')}-${crypto.randomBytes(8).toString('hex')}-01`;
}

let next = 0; // the URL the next connection tries first

async function connect(urls) {
  let last;
  for (let i = 0; i < urls.length; i++) {
    const url = urls[next++ % urls.length];
    try {
      const conn = await amqp.connect(url, { clientProperties: { connection_name: 'producer.js' } });
      conn.on('error', () => {}); // a lost connection fails its channel's pending publishes: handled there
      return conn;
    } catch (err) {
      last = err;
    }
  }
  throw last;
}

// attempt publishes each payment once and resolves with an error per
// payment: null when the broker acked it and did not return it.
async function attempt(ch, payments) {
  const returned = new Set();
  const onReturn = (msg) => returned.add(msg.properties.messageId);
  ch.on('return', onReturn); // the broker returns a message before it acks it
  try {
    const acks = payments.map((p) => new Promise((resolve) => {
      try {
        ch.publish('', QUEUE, p.body, {
          persistent: true,
          mandatory: true,
          contentType: 'application/json',
          messageId: p.messageId,
          timestamp: Math.floor(Date.now() / 1000),
          headers: { traceparent: p.traceparent },
        }, (err) => resolve(err ? `not confirmed: ${err.message}` : null));
      } catch (err) { // the channel is closed
        resolve(`not sent: ${err.message}`);
      }
    }));
    const errs = await Promise.all(acks);
    return errs.map((err, i) => err || (returned.has(payments[i].messageId) ? 'returned unroutable: no queue' : null));
  } finally {
    ch.removeListener('return', onReturn);
  }
}

async function main() {
  const urls = (process.env.PAYSVC_AMQP_URLS || '').split(',').filter(Boolean);
  let pending = process.argv.slice(2).map((arg) => {
    const m = /^(.+):([^:]+):([^:]+)$/.exec(arg); // an order number may hold colons
    if (!m) throw new Error(`${arg}: want ORDER_NO:USER_ID:AMOUNT`);
    const [, orderNo, userId, amount] = m;
    return { orderNo, body: body(orderNo, userId, amount), messageId: crypto.randomUUID(), traceparent: traceparent() };
  });
  const failed = new Map();
  let conn = null;
  let ch = null;
  let backoff = 250;
  for (let n = 1; pending.length > 0 && n <= ATTEMPTS; n++) {
    if (n > 1) {
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(2 * backoff, 5000);
    }
    let errs;
    try {
      if (!conn) {
        const c = await connect(urls);
        c.on('close', () => { if (conn === c) conn = ch = null; });
        conn = c;
      }
      if (!ch) {
        const c = await conn.createConfirmChannel();
        c.on('error', () => {}); // reported through the publishes' callbacks
        c.on('close', () => { if (ch === c) ch = null; });
        ch = c;
      }
      errs = await attempt(ch, pending);
    } catch (err) { // no connection, no channel
      errs = pending.map(() => `no connection: ${err.message}`);
    }
    const again = [];
    pending.forEach((p, i) => {
      if (errs[i] === null) {
        failed.delete(p.orderNo);
        console.log(`confirmed ${p.orderNo}`);
      } else {
        failed.set(p.orderNo, errs[i]);
        again.push(p);
      }
    });
    if (again.length > 0) {
      console.error(`attempt ${n}: ${again.length} not confirmed (${errs.find((e) => e !== null)}); publishing them again`);
      // A fresh channel (a new connection if it was lost): a quorum
      // queue over its limit may go on refusing the channel it refused.
      const old = ch;
      ch = null;
      if (old) await old.close().catch(() => {});
    }
    pending = again;
  }
  if (conn) await conn.close().catch(() => {});
  for (const [orderNo, why] of failed) console.log(`failed ${orderNo}: ${why}`);
  if (failed.size > 0) process.exit(1);
}

main().catch((err) => {
  console.error(err);
  process.exit(2);
});
