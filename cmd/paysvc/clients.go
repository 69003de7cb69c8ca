package main

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/tlsca"
)

// The client builders: what the configuration becomes for each client.

// mysqlDSN is mysql.dsn, made to trust mysql.caFile when one is set.
func (c *Config) mysqlDSN() (string, error) { return c.withCA(c.MySQL.DSN) }

// pruneDSN is prune.dsn, else mysql.dsn, with mysql.caFile applied.
func (c *Config) pruneDSN() (string, error) { return c.withCA(cmp.Or(c.Prune.DSN, c.MySQL.DSN)) }

func (c *Config) withCA(dsn string) (string, error) {
	if c.MySQL.CAFile == "" {
		return dsn, nil
	}
	t, err := tlsca.Config(c.MySQL.CAFile)
	if err != nil {
		return "", fmt.Errorf("mysql.caFile: %w", err)
	}
	return sqldb.WithCA(dsn, c.MySQL.CAFile, t)
}

// amqpTLS trusts amqp.caFile (nil: the system roots, for amqps:// URLs).
func (c *Config) amqpTLS() (*tls.Config, error) {
	if c.AMQP.CAFile == "" {
		return nil, nil
	}
	t, err := tlsca.Config(c.AMQP.CAFile)
	if err != nil {
		return nil, fmt.Errorf("amqp.caFile: %w", err)
	}
	return t, nil
}

// redisOptions builds the go-redis client options: one address, Sentinel
// (redis.masterName) or Cluster (several addresses), with TLS if redis.tls.
func (c *Config) redisOptions(poolSize int) (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{
		Addrs:      c.RedisAddrs(),
		MasterName: c.Redis.MasterName,
		Username:   c.Redis.Username,
		Password:   c.Redis.Password,
		// go-redis sends the sentinels these, never Username and Password.
		SentinelUsername: c.Redis.SentinelUsername,
		SentinelPassword: c.Redis.SentinelPassword,
		DB:               c.Redis.DB,
		DialTimeout:      2 * time.Second,
		ReadTimeout:      time.Second,
		WriteTimeout:     time.Second,
		PoolSize:         poolSize,
	}
	if c.Redis.TLS {
		t, err := tlsca.Config(c.Redis.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis.caFile: %w", err)
		}
		// No ServerName: each dial checks the certificate against the host
		// it dials (crypto/tls takes it from the address). Pinned to the
		// first address, a Sentinel setup would check the master it finds
		// against the sentinel's name, and never reach it.
		o.TLSConfig = t
	}
	return o, nil
}

// adminOperators is who may use the admin pages: admin.operators, and
// admin.token as the operator "admin" (the single-operator shorthand).
func (c *Config) adminOperators() ([]admin.Operator, error) {
	ops, err := admin.ParseOperators(c.Admin.Operators)
	if err != nil {
		return nil, err
	}
	if c.Admin.Token != "" {
		for _, op := range ops {
			if op.Name == "admin" {
				return nil, errors.New(`operator "admin" is also admin.token: name it differently`)
			}
		}
		ops = append(ops, admin.NewOperator("admin", c.Admin.Token))
	}
	return ops, nil
}
