-- One dead letter per distinct terminal payment, not per order number: a
-- second, different message for an order (another amount, a malformed copy)
-- is its own row with its own body, class and history. Copies of the same
-- payment (order, user and amount) still share one row. Rows filed under the
-- order number alone move to the new keys; the Go code computes the same
-- ones (deadletter.dedupKey).
UPDATE t_dead_letter
   SET dedup_key = CONCAT('pay:', SHA2(CONCAT(order_no, '|', user_id, '|', amount), 256))
 WHERE dedup_key = order_no AND user_id IS NOT NULL AND amount IS NOT NULL;

UPDATE t_dead_letter
   SET dedup_key = CONCAT('body:', SHA2(body, 256))
 WHERE dedup_key = order_no;
