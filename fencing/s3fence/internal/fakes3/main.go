// Command fakes3 serves the S3 API on a loopback address, from
// github.com/johannesboyne/gofakes3, for s3fence's tests: one bucket, kept
// in memory or, with -db, in a bbolt file that survives a restart.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	db := flag.String("db", "", "bbolt file to keep the objects in (default: memory)")
	bucket := flag.String("bucket", "dlock", "bucket to create at start")
	flag.Parse()
	if err := run(*addr, *db, *bucket); err != nil {
		log.Fatalf("fakes3: %v", err)
	}
}

func run(addr, db, bucket string) error {
	var backend gofakes3.Backend
	if db == "" {
		backend = s3mem.New()
	} else {
		b, err := s3bolt.NewFile(db)
		if err != nil {
			return err
		}
		backend = b
	}
	if err := backend.CreateBucket(bucket); err != nil && !errors.Is(err, gofakes3.ErrBucketAlreadyExists) && !gofakes3.HasErrorCode(err, gofakes3.ErrBucketAlreadyExists) {
		return fmt.Errorf("create bucket %q: %w", bucket, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "fakes3: serving on %s\n", ln.Addr())
	return http.Serve(ln, gofakes3.New(backend, gofakes3.WithAutoBucket(false)).Server())
}
