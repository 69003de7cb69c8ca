-- W3C trace context: the trace id of a parked payment (to find its spans and
-- log lines), and the traceparent a payment's notice is published with.
ALTER TABLE t_dead_letter ADD COLUMN trace_id VARCHAR(32) NOT NULL DEFAULT '';
ALTER TABLE t_dead_letter ADD KEY idx_trace_id (trace_id);
ALTER TABLE t_outbox ADD COLUMN traceparent VARCHAR(55) NOT NULL DEFAULT '';
