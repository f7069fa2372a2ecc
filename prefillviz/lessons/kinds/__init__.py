"""The lessons' action kinds, one module each: its run, the figures its step can show, the
results that make its page show the same run, and its ``KIND`` registration
(``lessons.registry`` lists the modules). A new kind is one new module here and one line there."""
