//! Monitor answers a page at a time: at most [`Page::limit`] rows, from
//! where the last page ended ([`Cursor`]), optionally of one user. A page
//! costs the ledger's task the rows it holds (plus, for sums and quotas, a
//! pass over the rows before it, which allocates nothing), so no monitor
//! query holds up filing and assigning for long, and none builds a
//! response of unbounded size.

/// Rows per service, in the order of the services' names; every known
/// service is listed, with no rows if it has none.
pub type ServiceRows<T> = Vec<(String, Vec<T>)>;

/// Which rows of a monitor answer to give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Most rows (keys for the distribution, entries for sums and
    /// quotas).
    pub limit: usize,
    /// Where the page starts: the `next` of the page before.
    pub after: Option<Cursor>,
    /// Only this user's rows.
    pub user: Option<String>,
    /// Only this service's rows.
    pub service: Option<String>,
}

impl Page {
    /// Every row, for callers in the process (tests, embedding).
    pub const ALL: Page = Page {
        limit: usize::MAX,
        after: None,
        user: None,
        service: None,
    };

    /// The first `limit` rows.
    pub fn first(limit: usize) -> Self {
        Self {
            limit,
            after: None,
            user: None,
            service: None,
        }
    }

    /// Where reading `service` starts, if it is read at all: services
    /// before the cursor's were on earlier pages.
    pub(super) fn start_of(&self, service: &str) -> Option<usize> {
        if self.service.as_deref().is_some_and(|s| s != service) {
            return None;
        }
        match &self.after {
            None => Some(0),
            Some(c) if *c.service == *service => Some(c.position),
            Some(c) => (service > c.service.as_str()).then_some(0),
        }
    }

    /// Whether a row of `user` belongs on the page.
    pub(super) fn wants(&self, user: &str) -> bool {
        self.user.as_deref().is_none_or(|u| u == user)
    }
}

/// Where a page ends and the next begins: a service and a position among
/// its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The service the next page starts in.
    pub service: String,
    /// The first row of that service on the next page.
    pub position: usize,
}

impl Cursor {
    /// As text for a URL: the position, a dot, the service's bytes in hex
    /// (a service name may hold any character).
    pub fn encode(&self) -> String {
        use std::fmt::Write;
        let mut out = format!("{}.", self.position);
        for b in self.service.bytes() {
            let _ = write!(out, "{b:02x}");
        }
        out
    }

    /// The cursor `text` encodes, if it is one.
    pub fn decode(text: &str) -> Option<Self> {
        let (position, hex) = text.split_once('.')?;
        if hex.len() % 2 != 0 || hex.len() > 2 * throttle_proto::MAX_NAME_LEN {
            return None;
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(Self {
            service: String::from_utf8(bytes).ok()?,
            position: position.parse().ok()?,
        })
    }
}

/// A page of rows per service, and where the next begins if there is more.
#[derive(Debug, Clone, PartialEq)]
pub struct Paged<T> {
    /// The rows, per service.
    pub rows: ServiceRows<T>,
    /// Where the next page starts; `None` on the last.
    pub next: Option<Cursor>,
}

/// Fills a page, service by service.
pub(super) struct Filler<T> {
    left: usize,
    rows: ServiceRows<T>,
    next: Option<Cursor>,
}

impl<T> Filler<T> {
    pub(super) fn new(page: &Page) -> Self {
        Self {
            left: page.limit,
            rows: Vec::new(),
            next: None,
        }
    }

    /// Starts `service`'s rows; `false` once the page is full.
    pub(super) fn open(&mut self, service: &str) -> bool {
        if self.next.is_some() {
            return false;
        }
        self.rows.push((service.to_owned(), Vec::new()));
        true
    }

    /// Adds the row at `position` of the open service (`add` appends it),
    /// or, the page being full, notes that the next page starts there.
    /// `false` once the page is full.
    pub(super) fn push(&mut self, position: usize, add: impl FnOnce(&mut Vec<T>)) -> bool {
        let Some((service, rows)) = self.rows.last_mut() else {
            return false;
        };
        if self.next.is_some() {
            return false;
        }
        if self.left == 0 {
            self.next = Some(Cursor {
                service: service.clone(),
                position,
            });
            return false;
        }
        self.left -= 1;
        add(rows);
        true
    }

    /// The page the filler holds.
    pub(super) fn finish(self) -> Paged<T> {
        Paged {
            rows: self.rows,
            next: self.next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_full_page_names_the_next_row_only_if_there_is_one() {
        let page = Page::first(2);
        let mut f = Filler::new(&page);
        assert!(f.open("a"));
        assert!(f.push(0, |r| r.push(0)));
        assert!(f.push(5, |r| r.push(5)));
        let done = f.finish();
        assert_eq!(done.rows, vec![("a".to_owned(), vec![0, 5])]);
        assert_eq!(done.next, None);

        let mut f = Filler::new(&page);
        f.open("a");
        f.push(0, |r| r.push(0));
        f.push(1, |r| r.push(1));
        assert!(!f.push(7, |r| r.push(7)));
        assert!(!f.open("b"));
        let cursor = Cursor {
            service: "a".into(),
            position: 7,
        };
        assert_eq!(f.finish().next, Some(cursor));
    }

    #[test]
    fn services_before_the_cursor_are_skipped() {
        let page = Page {
            after: Some(Cursor {
                service: "m".into(),
                position: 3,
            }),
            ..Page::first(10)
        };
        assert_eq!(page.start_of("a"), None);
        assert_eq!(page.start_of("m"), Some(3));
        assert_eq!(page.start_of("z"), Some(0));
    }

    proptest! {
        #[test]
        fn cursors_read_back(service in ".{0,40}", position in any::<usize>()) {
            let c = Cursor { service, position };
            prop_assert_eq!(Cursor::decode(&c.encode()), Some(c));
        }

        #[test]
        fn any_text_is_a_cursor_or_refused(text in ".{0,80}") {
            let _ = Cursor::decode(&text);
        }
    }
}
