module qprof.test/gcmgo

go 1.21
