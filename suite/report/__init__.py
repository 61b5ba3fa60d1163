"""Tables and figures rendered from records, paper beside ours; imports core and below, not tasks."""
