// Package lua holds tierlimit's Redis scripts, one .lua file each, where
// they can be read: the token bucket, GCRA, the fixed, anchored and sliding
// windows, the sliding log, the hybrid tier's lease ledger, its fleet's
// heartbeat and its charge-back marks, and lib.lua, the helpers every
// script is sent with. It exports their sources only. Compiling and
// calling them, and their KEYS, ARGV and replies, are a protocol between
// tierlimit's own packages, free to change between releases: each file's
// header states it, and docs/design.md proves what they keep.
package lua

import (
	"embed"
	"io/fs"
)

//go:embed *.lua
var files embed.FS

// Files holds the scripts' files, by name (for example "tokenbucket.lua"),
// lib.lua included.
var Files fs.FS = files

// Source returns the full text of the script in file name as it is sent
// to Redis: lib.lua, then the file. Redis defines every helper anew on each
// call, those a script leaves unused included; they cost too little to be
// worth leaving out (bench/RESULTS.md, "One path per script").
func Source(name string) (string, error) {
	lib, err := files.ReadFile("lib.lua")
	if err != nil {
		return "", err
	}
	body, err := files.ReadFile(name)
	if err != nil {
		return "", err
	}
	return string(lib) + "\n" + string(body), nil
}
