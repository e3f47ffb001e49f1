//! What the tests read of a response.

use http::{HeaderMap, Response, StatusCode};
use http_body_util::BodyExt;

/// A response's status, fields and text.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Answer {
    /// A response read whole.
    pub async fn read<B>(response: Response<B>) -> Answer
    where
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = response.into_parts();
        let text = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            text: String::from_utf8(text.to_vec()).unwrap(),
        }
    }

    /// The value of field `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}
