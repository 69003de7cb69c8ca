package main

import (
	"reflect"
	"strings"
	"time"
)

// key declares one configuration key, once: its name in config.yaml, its
// default, its field in Config, whether it is secret, its own validation
// and its line in the reference. The defaults, the environment variables,
// the unknown-key check, the decoding, the per-key validation, the logged
// (redacted) configuration and docs/configuration.md are all loops over
// keys; TestConfigFileMatchesDeclarations holds config.yaml to it.
type key struct {
	// name is section.key as spelled in config.yaml; the environment
	// variable is derived from it (envName).
	name string
	// def is the default, spelled as the environment variable would give
	// it (a list comma-separated): it is decoded like one.
	def string
	// doc is the key's description in the reference.
	doc string
	// secret: never logged; redacted() shows xxxxx when it is set.
	secret bool
	// redact, for a value holding a password (a URL, a DSN): what is
	// logged instead, with the password hidden.
	redact func(string) string
	// bind returns the field the key decodes into. Its type drives the
	// decoding: *string, *int, *bool, *float64, *time.Duration or
	// *[]time.Duration.
	bind func(*Config) any
	// norm, for a string, is applied to the decoded value (case, a
	// trailing slash).
	norm func(string) string
	// check is the key's own validation (nil: any value of its type);
	// the checks across keys are in validate.go (validateAcross).
	check func(v any, bad badFunc)
}

// minConsumerTimeout is amqp.consumerTimeout's floor: RabbitMQ's own
// default consumer_timeout. paysvc holds deliveries through an outage for
// as long as it lasts, and each time the broker takes them back costs each
// a delivery count.
const minConsumerTimeout = 30 * time.Minute

// keys is every configuration key, in config.yaml's order.
var keys = []key{
	{name: "amqp.url", def: "amqp://127.0.0.1:5672/", redact: redactURLs, check: checkAMQPURLs,
		bind: func(c *Config) any { return &c.AMQP.URL },
		doc:  "broker URL with vhost (guest/guest if no user is given); `amqps://` for TLS; a cluster: every node's URL, comma-separated"},
	{name: "amqp.prefetch", def: "128", check: between(1, 65535),
		bind: func(c *Config) any { return &c.AMQP.Prefetch },
		doc:  "unacked messages the broker may send ahead"},
	{name: "amqp.workers", def: "64", check: between(1, 1000), // each worker holds a publisher channel; RabbitMQ allows 2047 per connection
		bind: func(c *Config) any { return &c.AMQP.Workers },
		doc:  "goroutines handling deliveries (messages in hand at once), 1 to 1000"},
	{name: "amqp.drainTimeout", def: "30s", check: positive("want a positive duration"),
		bind: func(c *Config) any { return &c.AMQP.DrainTimeout },
		doc:  "at SIGTERM, bound on finishing in-flight messages"},
	{name: "amqp.queueType", def: "quorum", norm: strings.ToLower, check: oneOf("classic", "quorum"),
		bind: func(c *Config) any { return &c.AMQP.QueueType },
		doc:  "`q.pay.success` as `quorum` (replicated; dead-letters past the delivery limit) or `classic` (one node, development)"},
	{name: "amqp.deliveryLimit", def: "20", check: atLeast(1),
		bind: func(c *Config) any { return &c.AMQP.DeliveryLimit },
		doc:  "quorum: deliveries of one message before it goes to the terminal queue (a message that crashes every consumer). Outages spend none: paysvc holds the messages in hand while MySQL or Redis is down (up to `amqp.consumerTimeout`)"},
	{name: "amqp.consumerTimeout", def: "24h", check: minDuration(minConsumerTimeout), // and above the handling: validateAcross
		bind: func(c *Config) any { return &c.AMQP.ConsumerTimeout },
		doc: "RabbitMQ 3.12+: how long the broker lets paysvc hold a delivery unacknowledged (`x-consumer-timeout` on the consumer's and the parker's consumes, in place of the server's `consumer_timeout`, 30 min by default). " +
			"paysvc holds the messages in hand through an outage of MySQL or Redis for as long as it lasts (the parker, a terminal message through a database outage); past this the broker takes them all back, a delivery count each, and again every period the outage lasts, so a value shorter than an outage walks payable payments to `amqp.deliveryLimit` and the terminal queue. " +
			"At least 30m (RabbitMQ's own default, which 3.10 and 3.11 apply: an outage up to half an hour spends no delivery count, and a longer one a count per half hour: 10 hours to the default limit), and more than the handling timeout (`idempotent.lease`/2) plus `amqp.drainTimeout`, the longest paysvc holds a delivery outside an outage. " +
			"RabbitMQ 3.10 and 3.11 ignore it: there `consumer_timeout` alone applies"},
	{name: "amqp.caFile", def: "", check: existingFile,
		bind: func(c *Config) any { return &c.AMQP.CAFile },
		doc:  "PEM CA for `amqps://` (empty: the system roots)"},

	{name: "mysql.dsn", def: "root@tcp(127.0.0.1:3306)/paysvc", redact: redactDSN, check: checkDSN,
		bind: func(c *Config) any { return &c.MySQL.DSN },
		doc: "go-sql-driver DSN. paysvc sets `interpolateParams=true`, `multiStatements=true`, `parseTime=true`, `time_zone='+00:00'`, " +
			"READ COMMITTED and the two timeouts below on every connection; a DSN that says otherwise (`interpolateParams=false`, " +
			"`multiStatements=false`, `parseTime=false`, `clientFoundRows=true`, `loc` other than UTC, another `time_zone`, `autocommit=0`, " +
			"a non-strict `sql_mode`, or any of the session variables paysvc sets) stops start-up naming the parameter. " +
			"So does a server logging `binlog_format=STATEMENT`"},
	{name: "mysql.maxOpenConns", def: "20", check: atLeast(1),
		bind: func(c *Config) any { return &c.MySQL.MaxOpenConns },
		doc:  "connection pool size (payments plus the parker, dispatcher and monitor)"},
	{name: "mysql.groupSize", def: "16", check: between(1, 100),
		bind: func(c *Config) any { return &c.MySQL.GroupSize },
		doc:  "payments committed in one transaction at most (1 to 100), taken from those waiting at that moment (never waits to fill); 1 = one transaction per payment"},
	{name: "mysql.groupConns", def: "2", // 1 to mysql.maxOpenConns: validateAcross
		bind: func(c *Config) any { return &c.MySQL.GroupConns },
		doc:  "payment transactions running at once when grouping (1 to `mysql.maxOpenConns`)"},
	{name: "mysql.lockWaitTimeout", def: "5s", check: wholeSeconds, // below the handling timeout: validateAcross
		bind: func(c *Config) any { return &c.MySQL.LockWaitTimeout },
		doc:  "session `innodb_lock_wait_timeout`: a row lock held longer (an operator's open transaction) ends the wait in error 1205, a retry that spends an attempt; whole seconds, below the handling timeout (`idempotent.lease`/2)"},
	{name: "mysql.idleTransactionTimeout", def: "30s", check: wholeSeconds,
		bind: func(c *Config) any { return &c.MySQL.IdleTransactionTimeout },
		doc:  "the server ends a connection whose transaction sat idle this long (MariaDB `idle_transaction_timeout`; MySQL: `wait_timeout`), so a client that vanished mid-transaction cannot hold order and account locks for hours; whole seconds"},
	{name: "mysql.caFile", def: "", check: existingFile,
		bind: func(c *Config) any { return &c.MySQL.CAFile },
		doc:  "PEM CA: connect with TLS, verifying the server (else the DSN's own `tls=` applies)"},

	{name: "redis.addr", def: "127.0.0.1:6379", check: checkRedisAddrs,
		bind: func(c *Config) any { return &c.Redis.Addr },
		doc:  "one address; several, comma-separated, for Cluster or for the sentinels"},
	{name: "redis.username", def: "",
		bind: func(c *Config) any { return &c.Redis.Username },
		doc:  "Redis ACL user"},
	{name: "redis.password", def: "", secret: true,
		bind: func(c *Config) any { return &c.Redis.Password },
		doc:  "Redis password"},
	{name: "redis.db", def: "0", check: atLeast0("want 0 or more, got %d"),
		bind: func(c *Config) any { return &c.Redis.DB },
		doc:  "database number (0 only with a Redis Cluster)"},
	{name: "redis.masterName", def: "",
		bind: func(c *Config) any { return &c.Redis.MasterName },
		doc:  "Sentinel: the master's name (`redis.addr` lists the sentinels)"},
	{name: "redis.sentinelUsername", def: "", // needs redis.masterName: validateAcross
		bind: func(c *Config) any { return &c.Redis.SentinelUsername },
		doc:  "Sentinel: the sentinels' ACL user, when they have one (`redis.username` is the data nodes')"},
	{name: "redis.sentinelPassword", def: "", secret: true, // needs redis.masterName: validateAcross
		bind: func(c *Config) any { return &c.Redis.SentinelPassword },
		doc:  "Sentinel: the sentinels' password (their `requirepass`), when they have one (`redis.password` is the data nodes')"},
	{name: "redis.tls", def: "false",
		bind: func(c *Config) any { return &c.Redis.TLS },
		doc:  "connect with TLS"},
	{name: "redis.caFile", def: "", check: existingFile, // needs redis.tls: validateAcross
		bind: func(c *Config) any { return &c.Redis.CAFile },
		doc:  "PEM CA for `redis.tls` (empty: the system roots)"},

	{name: "idempotent.keyPrefix", def: "mq:consumed:pay_success:", check: nonEmpty,
		bind: func(c *Config) any { return &c.Idempotent.KeyPrefix },
		doc:  "Redis key = prefix + orderNo"},
	{name: "idempotent.ttl", def: "24h", check: minDuration(time.Minute),
		bind: func(c *Config) any { return &c.Idempotent.TTL },
		doc:  "life of a `done` key (1m at least)"},
	{name: "idempotent.lease", def: "60s", check: minDuration(2 * time.Second),
		bind: func(c *Config) any { return &c.Idempotent.Lease },
		doc:  "life of an in-flight claim whose holder died; one message's handling is bounded by half of it"},
	{name: "idempotent.redisFallback", def: "CLOSED", norm: strings.ToUpper, check: oneOf("CLOSED", "OPEN"),
		bind: func(c *Config) any { return &c.Idempotent.RedisFallback },
		doc:  "Redis down: `CLOSED` pauses consumption, `OPEN` goes on with the database guards alone"},

	{name: "retry.delays", def: "30s,1m,5m", check: checkDelays,
		bind: func(c *Config) any { return &c.Retry.Delays },
		doc:  "wait before retry n; the last repeats; one wait queue each (whole milliseconds, 100ms at least). A YAML list, or comma-separated (`1s,2s,3s`)"},
	{name: "retry.maxAttempts", def: "5", check: atLeast0("want 0 or more, got %d"),
		bind: func(c *Config) any { return &c.Retry.MaxAttempts },
		doc:  "retries before the terminal queue"},

	{name: "http.addr", def: "127.0.0.1:8080", check: hostPortOrEmpty,
		bind: func(c *Config) any { return &c.HTTP.Addr },
		doc:  "HTTP listener: `/healthz`, `/readyz`, `/metrics`, and the operator pages (`/dlq`) unless `admin.addr` is set; empty disables it"},

	{name: "log.level", def: "info", norm: strings.ToLower, check: oneOf("debug", "info", "warn", "error"),
		bind: func(c *Config) any { return &c.Log.Level },
		doc:  "debug, info, warn or error"},
	{name: "log.format", def: "json", norm: strings.ToLower, check: oneOf("json", "console"),
		bind: func(c *Config) any { return &c.Log.Format },
		doc:  "json or console"},
	{name: "log.firstPerSecond", def: "0", check: atLeast0("want 0 (every applied payment logged) or more, got %d"),
		bind: func(c *Config) any { return &c.Log.FirstPerSecond },
		doc:  "0: every applied payment's line is logged; N: the first N FIRST lines each second, then one in 100. Every other outcome and every error is always logged. `paysvc trace --log` then misses the sampled-out FIRST lines (the order, its flow and notice still show the payment)"},

	{name: "admin.addr", def: "", check: hostPortOrEmpty, // not http.addr: validateAcross
		bind: func(c *Config) any { return &c.Admin.Addr },
		doc: "a listener of their own for the operator pages (`/login`, `/dlq`, `/admin/sessions`), e.g. `:8081`: " +
			"then `http.addr` serves only `/healthz`, `/readyz` and `/metrics` (the pages answer 404 there), so a network policy can let monitoring scrape `http.addr` without reaching the pages. " +
			"Empty: the pages are on `http.addr`"},
	{name: "admin.operators", def: "", secret: true, // parsed with admin.token: validateAcross
		bind: func(c *Config) any { return &c.Admin.Operators },
		doc:  "who may sign in to the `/dlq` pages: `NAME:TOKEN` (16+ characters) or `NAME:sha256:HEX`, comma- or newline-separated; the audit trail records the signed-in name. Placeholder tokens (`CHANGE-ME`...) stop start-up. No operator: the pages are off"},
	{name: "admin.token", def: "", secret: true, check: checkAdminToken,
		bind: func(c *Config) any { return &c.Admin.Token },
		doc:  "shorthand for one operator named `admin` (16+ characters)"},
	{name: "admin.sessionTtl", def: "8h", check: durationBetween(time.Minute, 7*24*time.Hour),
		bind: func(c *Config) any { return &c.Admin.SessionTTL },
		doc:  "a sign-in's life, 1m to 168h (sessions live in `t_admin_session`, shared by the replicas; sign out or revoke on `/admin/sessions` to end one)"},
	{name: "admin.secureCookie", def: "true",
		bind: func(c *Config) any { return &c.Admin.SecureCookie },
		doc: "the session cookie carries `Secure`, whatever the request arrived over (behind a TLS-terminating ingress paysvc sees plain HTTP): browsers send it over HTTPS only, and to `localhost`/`127.0.0.1` over plain HTTP. " +
			"`false` only for the pages over plain HTTP on another address (a compose host reached by its name); never behind an ingress"},

	{name: "alert.webhookUrl", def: "", secret: true, check: httpURL("want an http:// or https:// URL", false),
		bind: func(c *Config) any { return &c.Alert.WebhookURL },
		doc:  "POSTed once per dead letter that becomes NEW; never logged"},

	{name: "metrics.queueInterval", def: "15s", check: minDuration(100 * time.Millisecond),
		bind: func(c *Config) any { return &c.Metrics.QueueInterval },
		doc:  "how often queue depths and ages are sampled for `/metrics`"},

	{name: "reconcile.interval", def: "0s", check: offOrAtLeastSecond,
		bind: func(c *Config) any { return &c.Reconcile.Interval },
		doc:  "0: off; else run reconciliation inside the daemon this often (1s at least)"},
	{name: "reconcile.window", def: "24h", check: positive("want a positive duration, got %s"),
		bind: func(c *Config) any { return &c.Reconcile.Window },
		doc:  "how far back the scheduled run looks at flows and payments"},
	{name: "reconcile.fix", def: "false",
		bind: func(c *Config) any { return &c.Reconcile.Fix },
		doc:  "the scheduled run books reversals for duplicate flows"},
	{name: "reconcile.lostSweepRate", def: "2000", check: atLeast0("want 0 (off) or more keys a second, got %d"),
		bind: func(c *Config) any { return &c.Reconcile.LostSweepRate },
		doc: "Redis guard keys each instance reads a second, walking the done keys (SCAN) for payments a database failover lost: " +
			"an order whose key says done while the database has it INIT or missing (`paysvc_lost_payments`, a log line per order). " +
			"A walk starts at most every `metrics.queueInterval`; N keys in Redis take N/rate seconds, and each done key costs a " +
			"primary-key read of its order. 0: off"},

	{name: "trace.otlpEndpoint", def: "", secret: true, norm: func(s string) string { return strings.TrimSuffix(s, "/") },
		check: httpURL("want an http:// or https:// URL of an OTLP/HTTP collector, no query (e.g. http://otel-collector:4318)", true),
		bind:  func(c *Config) any { return &c.Trace.OTLPEndpoint },
		doc: "OTLP/HTTP collector (`http://otel-collector:4318`; spans go to its `/v1/traces`, protobuf): a CONSUMER span per message, " +
			"with the database transaction as its child, through the OpenTelemetry SDK (batched; headers, compression, timeout and retries " +
			"from the standard `OTEL_EXPORTER_OTLP_*` variables). Set, it wins over `OTEL_EXPORTER_OTLP_ENDPOINT` and " +
			"`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; empty: those variables decide, and with neither set spans are not exported. " +
			"Off or on, a message's W3C `traceparent` is carried into its log lines (`trace_id`), its retry and terminal copies, " +
			"its notice and its dead letter"},
	{name: "trace.sampleRatio", def: "1", check: ratio,
		bind: func(c *Config) any { return &c.Trace.SampleRatio },
		doc: "0 to 1: the share of the traces paysvc starts (messages without a `traceparent`) whose spans are exported; a message " +
			"with a `traceparent` follows its sampled flag (parent-based: `01` exported, `00` not). " +
			"`OTEL_TRACES_SAMPLER` (with `OTEL_TRACES_SAMPLER_ARG`), if set, replaces it"},

	{name: "prune.outboxAfter", def: "2160h", check: offOrAtLeast(time.Hour),
		bind: func(c *Config) any { return &c.Prune.OutboxAfter },
		doc:  "`paysvc prune` deletes a payment-success notice (`t_outbox`) this long after it was sent (2160h: 90 days); one not sent yet never goes. 0: never; else 1h at least"},
	{name: "prune.eventsAfter", def: "2160h", check: offOrAtLeast(time.Hour),
		bind: func(c *Config) any { return &c.Prune.EventsAfter },
		doc:  "`paysvc prune` deletes a payment event (`t_payment_event`, what `paysvc trace` shows of retries and duplicates) this long after it was written. 0: never; else 1h at least"},
	{name: "prune.sessionsAfter", def: "168h", check: offOrAtLeast(time.Hour),
		bind: func(c *Config) any { return &c.Prune.SessionsAfter },
		doc:  "`paysvc prune` deletes an admin sign-in (`t_admin_session`) this long after it expired. 0: never; else 1h at least"},
	{name: "prune.deadLettersAfter", def: "4320h", check: offOrAtLeast(time.Hour),
		bind: func(c *Config) any { return &c.Prune.DeadLettersAfter },
		doc:  "`paysvc prune` deletes a resolved dead letter (`REPLAYED` or `DISCARDED`), with its history, this long after its last change (4320h: 180 days); a `NEW` one never goes. 0: never; else 1h at least"},
	{name: "prune.batch", def: "1000", check: between(1, 10000),
		bind: func(c *Config) any { return &c.Prune.Batch },
		doc:  "rows `paysvc prune` deletes in one transaction at most, 1 to 10000"},
	{name: "prune.pause", def: "20ms", check: atLeast0Duration,
		bind: func(c *Config) any { return &c.Prune.Pause },
		doc:  "`paysvc prune`'s wait between two batches, which leaves the database to the payments"},
	{name: "prune.interval", def: "0s", check: offOrAtLeastSecond,
		bind: func(c *Config) any { return &c.Prune.Interval },
		doc:  "0: off; else the daemon runs `paysvc prune` itself this often (1s at least), one replica at a time, counting `paysvc_pruned_rows_total`. It connects with `prune.dsn`, else `mysql.dsn` (whose least-privilege user has no `DELETE`: set `prune.dsn`)"},
	{name: "prune.dsn", def: "", redact: redactDSN, check: checkDSNOrEmpty,
		bind: func(c *Config) any { return &c.Prune.DSN },
		doc:  "the go-sql-driver DSN pruning connects with (a user with `DELETE` on the pruned tables: `paysvc_prune` of `scripts/least-privilege.sh`), for `paysvc prune` and `prune.interval`; `mysql.caFile` applies. Empty: `mysql.dsn`"},
}

// envName is the environment variable for a key: amqp.url → PAYSVC_AMQP_URL
// (and PAYSVC_AMQP_URL_FILE naming a file that holds the value).
func envName(name string) string {
	return "PAYSVC_" + strings.ToUpper(strings.ReplaceAll(name, ".", "_"))
}

// value is the key's current value in c (a string, int, bool,
// time.Duration or []time.Duration).
func (k *key) value(c *Config) any {
	return reflect.ValueOf(k.bind(c)).Elem().Interface()
}
