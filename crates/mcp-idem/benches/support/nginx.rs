//! nginx as the peer a user without mcp-idem would put in front of the server: a plain reverse
//! proxy with one worker and keep-alive connections to the upstream (Debian package `nginx-light`).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts nginx in front of `upstream` (`host:port`), with its files in `dir`; returns the child
/// (the master, its worker a child of it) and the `http://…/mcp` URL it serves.
pub(crate) fn start(upstream: &str, dir: &Path) -> Result<(Child, String), String> {
    let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .ok_or("nginx is not installed (Debian package nginx-light)")?;
    // A free port: bound and let go, then taken by nginx.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let d = dir.display();
    let config = format!(
        "daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log error;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {d}/nginx-body;
    proxy_temp_path {d}/nginx-proxy;
    fastcgi_temp_path {d}/nginx-fastcgi;
    uwsgi_temp_path {d}/nginx-uwsgi;
    scgi_temp_path {d}/nginx-scgi;
    upstream mcp {{
        server {upstream};
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://mcp;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host $host;
            proxy_buffering off;
        }}
    }}
}}
"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, config).map_err(|e| e.to_string())?;
    let child = Command::new(bin)
        .args(["-e", "stderr", "-p"])
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("nginx did not listen on port {port}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((child, format!("http://127.0.0.1:{port}/mcp")))
}
