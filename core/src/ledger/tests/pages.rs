//! Monitor answers a page at a time: pages put together are the whole
//! answer, in order, and a page of one user holds only theirs.

use super::*;

/// A ledger of `users` users of two resources each in `front`, reported
/// by nodes a and b in slots 99 and 100, and u3 limited.
fn busy(users: usize) -> Ledger {
    let mut l = keeping(10);
    l.apply_limits("front", &[limit("u3", "requests", 100.0)], T);
    let entries: Vec<String> = (0..users)
        .map(|i| format!(r#""u{i}": {{"requests": {}, "bytes": 7}}"#, i + 1))
        .collect();
    let users = format!("{{{}}}", entries.join(", "));
    for slot in [99, 100] {
        for node in ["a", "b"] {
            l.ingest(&report(node, slot, &users, "{}"), T).unwrap();
        }
    }
    l.assign(T + 500);
    l
}

/// Every page of `view` at `limit` rows, read one after the other.
fn all_pages<T: Clone>(limit: usize, view: impl Fn(&Page) -> Paged<T>) -> Vec<Paged<T>> {
    let mut page = Page::first(limit);
    let mut pages = Vec::new();
    loop {
        let got = view(&page);
        assert!(pages.len() < 10_000, "pages end");
        let next = got.next.clone();
        pages.push(got);
        match next {
            Some(cursor) => page.after = Some(cursor),
            None => return pages,
        }
    }
}

/// The rows of `pages`, service by service, as one answer would list them.
fn joined<T: Clone>(pages: &[Paged<T>]) -> Vec<(String, T)> {
    let rows = pages.iter().flat_map(|p| p.rows.iter());
    rows.flat_map(|(s, rows)| rows.iter().map(move |r| (s.clone(), r.clone())))
        .collect()
}

fn whole<T: Clone>(view: &Paged<T>) -> Vec<(String, T)> {
    joined(std::slice::from_ref(view))
}

#[test]
fn distribution_pages_make_the_whole_in_order() {
    let l = busy(50);
    let view = |page: &Page| Monitor::of(&l).distribution(SlotRange::default(), T, page);
    let all = view(&Page::ALL);
    assert_eq!(all.next, None);
    assert_eq!(whole(&all).len(), 100);
    for limit in [1, 7, 99, 100, 101] {
        let pages = all_pages(limit, view);
        assert_eq!(joined(&pages), whole(&all), "limit {limit}");
        assert!(
            pages
                .iter()
                .all(|p| p.rows.iter().map(|r| r.1.len()).sum::<usize>() <= limit)
        );
        assert_eq!(pages.len(), 100usize.div_ceil(limit).max(1));
    }
}

#[test]
fn sums_and_quota_pages_make_the_whole_in_order() {
    let l = busy(30);
    let sums = |page: &Page| Monitor::of(&l).sums(SlotRange::default(), false, page);
    let all = sums(&Page::ALL);
    assert_eq!(
        whole(&all).len(),
        2 * 2 * 30,
        "two slots of 30 users' two resources"
    );
    for limit in [1, 13, 120, 500] {
        assert_eq!(
            joined(&all_pages(limit, sums)),
            whole(&all),
            "limit {limit}"
        );
    }
    let quota = |page: &Page| Monitor::of(&l).quota(SlotRange::default(), page);
    let grants = |pages: &[Paged<QuotaSlot>]| {
        let rows = joined(pages);
        let flat = rows
            .into_iter()
            .flat_map(|(s, q)| q.grants.into_iter().map(move |g| (s.clone(), q.slot, g)));
        flat.collect::<Vec<_>>()
    };
    let all = grants(&[quota(&Page::ALL)]);
    assert!(!all.is_empty(), "u3 has quotas");
    for limit in [1, 2, 3] {
        assert_eq!(grants(&all_pages(limit, quota)), all, "limit {limit}");
    }
}

#[test]
fn a_page_of_one_user_holds_theirs_only() {
    let l = busy(50);
    let page = Page {
        user: Some("u7".into()),
        ..Page::first(10)
    };
    let view = Monitor::of(&l).distribution(SlotRange::default(), T, &page);
    let rows = whole(&view);
    assert_eq!(rows.len(), 2, "requests and bytes");
    assert!(rows.iter().all(|(_, k)| k.user == "u7"));
    let sums = whole(&Monitor::of(&l).sums(SlotRange::default(), false, &page));
    assert_eq!(sums.len(), 4, "two resources in two slots");
    assert!(sums.iter().all(|(_, r)| r.user == "u7"));
    let nobody = Page {
        user: Some("nobody".into()),
        ..Page::first(10)
    };
    let view = Monitor::of(&l).distribution(SlotRange::default(), T, &nobody);
    assert!(whole(&view).is_empty());
    assert_eq!(view.next, None);
}
