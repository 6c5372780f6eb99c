"""Attribution: stacks -> categories through mapping files, aggregated per process and thread."""
