package main

// Every driver registers its DSN schemes when imported.
import (
	_ "github.com/dlock-go/dlock/etcd"
	_ "github.com/dlock-go/dlock/memlock" // mem://: the CLI refuses it without --allow-mem (checkCrossProcess)
	_ "github.com/dlock-go/dlock/mysql"
	_ "github.com/dlock-go/dlock/nats"
	_ "github.com/dlock-go/dlock/postgres"
	_ "github.com/dlock-go/dlock/redis"
	_ "github.com/dlock-go/dlock/redlock"
	_ "github.com/dlock-go/dlock/sqltable"
	_ "github.com/dlock-go/dlock/zookeeper"
)
