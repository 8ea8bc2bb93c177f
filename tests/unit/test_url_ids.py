"""url_id: one id per page across jobs and versions (outputs of different jobs join on it)."""

from frontier.url_ids import url_id


def test_spellings_a_crawl_treats_as_one_page_share_an_id():
    same = ["http://example.com/~user", "HTTP://EXAMPLE.com:80/%7Euser", "http://example.com./%7euser#x",
            "http://example.com/~user?utm_source=mail"]  # fmt: skip
    assert len({url_id(u) for u in same}) == 1


def test_different_pages_get_different_ids():
    pages = ["http://example.com/", "https://example.com/", "http://example.com/?a=1", "http://example.com/a"]
    assert len({url_id(u) for u in pages}) == len(pages)


def test_the_id_is_stable_across_versions():
    # Ids are stored in records, WARC headers and databases: a change of the hash would break every join.
    assert url_id("http://example.com/") == "2a1b402420ef4657"


def test_an_unparsable_url_still_gets_an_id():
    assert len(url_id("http://[bad/")) == 16
