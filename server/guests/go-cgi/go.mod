module tern.invalid/go-cgi

go 1.26
