//! An HTTP/1.1 receiver on a free loopback port that records every request
//! and answers as a test scripts it: what the tests of an HTTP sink need
//! (statuses, `Retry-After`, bodies, a server that never answers, one
//! that closes a kept-alive connection while it is idle).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::HarnessError;

/// One request as it arrived.
#[derive(Clone, Debug)]
pub struct Received {
    /// The method.
    pub method: String,
    /// The path and query.
    pub path: String,
    /// The headers, names in lower case, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// The connection it came on, numbered from 1.
    pub connection: usize,
    /// When its head had been read.
    pub at: std::time::Instant,
    /// The status it was answered (0: never answered).
    pub status: u16,
}

impl Received {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How the receiver answers one request.
#[derive(Clone, Debug)]
pub enum Answer {
    /// A status with headers and a body; `close` closes the connection
    /// right after, without saying so (as a server whose keep-alive
    /// timeout ends does).
    Status {
        /// The status code.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: String,
        /// Close the connection after answering.
        close: bool,
    },
    /// Read the request and never answer.
    Silent,
}

impl Answer {
    /// `status` with no body.
    pub fn status(status: u16) -> Answer {
        Answer::Status {
            status,
            headers: Vec::new(),
            body: String::new(),
            close: false,
        }
    }

    /// This answer with header `name: value` too.
    #[must_use]
    pub fn with_header(mut self, name: &str, value: &str) -> Answer {
        if let Answer::Status { headers, .. } = &mut self {
            headers.push((name.to_owned(), value.to_owned()));
        }
        self
    }

    /// This answer with `body`.
    #[must_use]
    pub fn with_body(mut self, text: &str) -> Answer {
        if let Answer::Status { body, .. } = &mut self {
            *body = text.to_owned();
        }
        self
    }

    /// This answer, then the connection closed without a word.
    #[must_use]
    pub fn then_close(mut self) -> Answer {
        if let Answer::Status { close, .. } = &mut self {
            *close = true;
        }
        self
    }
}

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Received>>,
    script: Mutex<VecDeque<Answer>>,
    connections: AtomicUsize,
    stop: AtomicBool,
    /// Refuses a `Guard-Fence` below the highest it has taken, with 409
    /// and `Guard-Highest-Fence` (a fenced receiver).
    fenced: AtomicBool,
    highest: Mutex<Option<u64>>,
}

/// The receiver; stopped when dropped. Unscripted requests get `204`.
pub struct HttpReceiver {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl HttpReceiver {
    /// A receiver on a free 127.0.0.1 port.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_on(0)
    }

    /// A receiver on 127.0.0.1 `port` (0: a free one): to bring one back
    /// where an earlier one, dropped, was reached ([`port`](Self::port)).
    pub fn start_on(port: u16) -> Result<Self, HarnessError> {
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accepting.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let number = accepting.connections.fetch_add(1, Ordering::SeqCst) + 1;
                let shared = accepting.clone();
                std::thread::spawn(move || serve(stream, number, &shared));
            }
        });
        Ok(HttpReceiver {
            port,
            shared,
            accept: Some(accept),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The next requests get these answers, in order.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.shared
            .script
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(answers);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Received> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the receiver and returns every request it recorded: each one
    /// it answered is there, and it answers none after (a request read
    /// from then on is dropped with its connection, unanswered).
    pub fn stop(self) -> Vec<Received> {
        let requests = {
            let recorded = self
                .shared
                .requests
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.stop.store(true, Ordering::SeqCst);
            recorded.clone()
        };
        drop(self);
        requests
    }

    /// From now on, a fenced receiver: a request whose `Guard-Fence` is
    /// below the highest one it has answered 2xx is answered 409 with
    /// `Guard-Highest-Fence: <highest>` (before any scripted answer).
    pub fn fenced(&self) {
        self.shared.fenced.store(true, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Serves one connection until the client closes it, an answer closes it
/// or the receiver stops.
fn serve(stream: TcpStream, number: usize, shared: &Shared) {
    // Wakes up now and then to see whether the receiver stopped.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while !shared.stop.load(Ordering::SeqCst) {
        let Some(request) = read_request(&mut reader, number, shared) else {
            return;
        };
        let answer = answer_to(&request, shared);
        {
            // Checked under the lock `stop` takes: a request is either
            // recorded before the stop (and answered) or not answered.
            let mut recorded = shared
                .requests
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            let status = match &answer {
                Answer::Status { status, .. } => *status,
                Answer::Silent => 0,
            };
            recorded.push(Received { status, ..request });
        }
        match answer {
            Answer::Silent => {
                // Holds the connection open until the client gives up.
                let mut sink = [0u8; 1024];
                while !shared.stop.load(Ordering::SeqCst) {
                    match reader.read(&mut sink) {
                        Ok(0) => return,
                        Ok(_) => {}
                        Err(e) if is_timeout(&e) => {}
                        Err(_) => return,
                    }
                }
                return;
            }
            Answer::Status {
                status,
                headers,
                body,
                close,
            } => {
                let mut head = format!(
                    "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\n",
                    reason(status),
                    body.len()
                );
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str("\r\n");
                if writer.write_all(head.as_bytes()).is_err()
                    || writer.write_all(body.as_bytes()).is_err()
                    || close
                {
                    return;
                }
            }
        }
    }
}

/// The answer to `request`: a fenced receiver's refusal of a stale fence,
/// else the next scripted one (204 when none is).
fn answer_to(request: &Received, shared: &Shared) -> Answer {
    let fence = request
        .header("guard-fence")
        .and_then(|f| f.parse::<u64>().ok());
    let mut highest = shared
        .highest
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if shared.fenced.load(Ordering::SeqCst)
        && let (Some(fence), Some(top)) = (fence, *highest)
        && fence < top
    {
        return Answer::status(409).with_header("Guard-Highest-Fence", &top.to_string());
    }
    let answer = shared
        .script
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop_front()
        .unwrap_or(Answer::status(204));
    if let (Answer::Status { status, .. }, Some(fence)) = (&answer, fence)
        && (200..300).contains(status)
    {
        *highest = Some(highest.map_or(fence, |top| top.max(fence)));
    }
    answer
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// One request's head and body; `None` once the connection ends or the
/// receiver stops.
fn read_request(
    reader: &mut BufReader<TcpStream>,
    connection: usize,
    shared: &Shared,
) -> Option<Received> {
    let mut line = String::new();
    let mut lines = Vec::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return None,
            Ok(_) => {
                let trimmed = line.trim_end().to_owned();
                if trimmed.is_empty() {
                    if lines.is_empty() {
                        continue;
                    }
                    break;
                }
                lines.push(trimmed);
            }
            Err(e) if is_timeout(&e) => {
                if shared.stop.load(Ordering::SeqCst) {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
    let at = std::time::Instant::now();
    let mut first = lines.first()?.split(' ');
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: Vec<(String, String)> = lines[1..]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    let mut read = 0;
    while read < length {
        match reader.read(&mut body[read..]) {
            Ok(0) => return None,
            Ok(n) => read += n,
            Err(e) if is_timeout(&e) => {}
            Err(_) => return None,
        }
    }
    Some(Received {
        method,
        path,
        headers,
        body,
        connection,
        at,
        status: 0,
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        409 => "Conflict",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
