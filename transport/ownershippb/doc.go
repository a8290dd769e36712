// Package ownershippb holds the generated Go code of the tenure ownership
// service (ownership.proto): Lookup answers who owns a key, Watch streams
// ownership changes. Programs in other languages generate their own code
// from the same file. The server is routing.NewOwnershipService (package transport/routing).
//
// The generated files are committed. To regenerate them after editing
// ownership.proto, install protoc (3.21 or later; Debian: apt-get install
// protobuf-compiler) and the two plugins, then run go generate from the
// module root:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
//	go generate ./transport/ownershippb
package ownershippb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative ownership.proto
