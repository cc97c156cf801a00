#!/usr/bin/env bash
# Sourced by the scripts that start TLS test servers (tls-postgres.sh, tls-redis.sh):
#
#   test_certificates DIR
#
# makes, once, in DIR: a throwaway test CA (ca.pem, ca.key) and a server certificate it issued
# for localhost and 127.0.0.1 (server.pem, server.key), valid 30 days, with openssl. Files already
# there are kept, so a server that runs on them keeps matching its CA.

test_certificates() {
    local dir=$1
    [ -f "$dir/server.key" ] && return 0
    command -v openssl >/dev/null || { echo "openssl is missing" >&2; return 1; }
    mkdir -p "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=mcp-idem test CA" \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
        -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >"$dir/ext.cnf"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
        -CAcreateserial -days 30 -extfile "$dir/ext.cnf" -out "$dir/server.pem" 2>/dev/null
    chmod 600 "$dir/server.key" "$dir/ca.key"
}
