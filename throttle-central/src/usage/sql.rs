//! The SQL both backends run, in the dialect they share: `?N` parameters
//! (PostgreSQL's `$N` are written from them, [`dollars`]), `BIGINT` and
//! `TEXT` columns, `ON CONFLICT` upserts.

use super::step::Step;
use super::{RowsQuery, TopQuery};

/// A parameter of a query built here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Param {
    /// A `BIGINT`.
    Int(i64),
    /// A `TEXT`.
    Text(String),
}

/// The tables, created when missing. A row's `start` is the Unix second
/// its minute, hour or day (UTC) starts at; `usage_filed` marks each
/// (node, data slot) written, with the slot's start.
pub(super) fn schema() -> Vec<String> {
    let mut statements: Vec<String> = Step::ALL
        .into_iter()
        .flat_map(|step| {
            let t = step.table();
            [
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     start BIGINT NOT NULL, service TEXT NOT NULL, user_name TEXT NOT NULL, \
                     resource TEXT NOT NULL, admitted BIGINT NOT NULL, refused BIGINT NOT NULL, \
                     PRIMARY KEY (service, user_name, resource, start))"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_by_start ON {t} (service, start)"),
            ]
        })
        .collect();
    statements.push(
        "CREATE TABLE IF NOT EXISTS usage_filed (\
         node TEXT NOT NULL, slot BIGINT NOT NULL, start BIGINT NOT NULL, \
         PRIMARY KEY (node, slot))"
            .into(),
    );
    statements
        .push("CREATE INDEX IF NOT EXISTS usage_filed_by_start ON usage_filed (start)".into());
    statements
}

/// Marks (node ?1, slot ?2, start ?3) written; changes no row when it was.
pub(super) const MARK: &str =
    "INSERT INTO usage_filed (node, slot, start) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING";

/// Adds (admitted ?5, refused ?6) to the row (start ?1, service ?2, user
/// ?3, resource ?4) of `step`'s table.
pub(super) fn add(step: Step) -> String {
    let t = step.table();
    format!(
        "INSERT INTO {t} (start, service, user_name, resource, admitted, refused) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT (service, user_name, resource, start) DO UPDATE SET \
         admitted = {t}.admitted + excluded.admitted, refused = {t}.refused + excluded.refused"
    )
}

/// Deletes the rows of `step` before ?1.
pub(super) fn prune(step: Step) -> String {
    format!("DELETE FROM {} WHERE start < ?1", step.table())
}

/// Deletes the marks of slots before ?1.
pub(super) const PRUNE_MARKS: &str = "DELETE FROM usage_filed WHERE start < ?1";

/// A page of rows: (start, user, resource, admitted, refused).
pub(super) fn rows(q: &RowsQuery) -> (String, Vec<Param>) {
    let mut params = vec![
        Param::Text(q.service.clone()),
        Param::Int(q.from_s),
        Param::Int(q.to_s),
    ];
    let mut sql = format!(
        "SELECT start, user_name, resource, admitted, refused FROM {} \
         WHERE service = ?1 AND start >= ?2 AND start < ?3",
        q.step.table()
    );
    let mut next = |sql: &mut String, clause: &str, value: Param| {
        params.push(value);
        sql.push_str(&clause.replace('#', &format!("?{}", params.len())));
    };
    if let Some(user) = &q.user {
        next(&mut sql, " AND user_name = #", Param::Text(user.clone()));
    }
    if let Some(resource) = &q.resource {
        next(&mut sql, " AND resource = #", Param::Text(resource.clone()));
    }
    if let Some(after) = &q.after {
        next(&mut sql, " AND (start > #", Param::Int(after.start_s));
        next(&mut sql, " OR (start = #", Param::Int(after.start_s));
        next(
            &mut sql,
            " AND (user_name > #",
            Param::Text(after.user.clone()),
        );
        next(
            &mut sql,
            " OR (user_name = #",
            Param::Text(after.user.clone()),
        );
        next(
            &mut sql,
            " AND resource > #))))",
            Param::Text(after.resource.clone()),
        );
    }
    next(
        &mut sql,
        " ORDER BY start, user_name, resource LIMIT #",
        Param::Int(i64::try_from(q.limit).unwrap_or(i64::MAX)),
    );
    (sql, params)
}

/// The heaviest users: (user, admitted, refused).
pub(super) fn top(q: &TopQuery) -> (String, Vec<Param>) {
    let sql = format!(
        "SELECT user_name, CAST(SUM(admitted) AS BIGINT), CAST(SUM(refused) AS BIGINT) FROM {} \
         WHERE service = ?1 AND resource = ?2 AND start >= ?3 AND start < ?4 \
         GROUP BY user_name ORDER BY SUM(admitted) DESC, user_name LIMIT ?5",
        q.step.table()
    );
    let params = vec![
        Param::Text(q.service.clone()),
        Param::Text(q.resource.clone()),
        Param::Int(q.from_s),
        Param::Int(q.to_s),
        Param::Int(i64::try_from(q.n).unwrap_or(i64::MAX)),
    ];
    (sql, params)
}

/// The resources with rows: (resource).
pub(super) fn resources(q: &TopQuery) -> (String, Vec<Param>) {
    let sql = format!(
        "SELECT DISTINCT resource FROM {} WHERE service = ?1 AND start >= ?2 AND start < ?3 \
         ORDER BY resource",
        q.step.table()
    );
    let params = vec![
        Param::Text(q.service.clone()),
        Param::Int(q.from_s),
        Param::Int(q.to_s),
    ];
    (sql, params)
}

/// `sql` with PostgreSQL's `$N` for each `?N`.
pub(super) fn dollars(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        let numbered = c == '?' && chars.peek().is_some_and(char::is_ascii_digit);
        out.push(if numbered { '$' } else { c });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::RowCursor;

    #[test]
    fn a_page_after_a_cursor_numbers_its_parameters_in_order() {
        let q = RowsQuery {
            step: Step::Hour,
            service: "front".into(),
            user: None,
            resource: Some("bytes".into()),
            from_s: 0,
            to_s: 3_600,
            after: Some(RowCursor {
                start_s: 0,
                user: "alice".into(),
                resource: "bytes".into(),
            }),
            limit: 10,
        };
        let (sql, params) = rows(&q);
        assert_eq!(params.len(), 10);
        assert!(
            sql.contains("resource = ?4 AND (start > ?5 OR (start = ?6"),
            "{sql}"
        );
        assert!(sql.ends_with("LIMIT ?10"), "{sql}");
        assert_eq!(dollars("a = ?1 AND b = ?12 ?"), "a = $1 AND b = $12 ?");
    }
}
